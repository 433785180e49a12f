"""``merge-traces`` on valid JSON whose values have the wrong type: one line naming file and field."""

from __future__ import annotations

import pytest

from memprofiler.__main__ import main


@pytest.mark.parametrize(
    ("text", "field", "shown"),
    [
        ('{"traceEvents": [{"ph": "C", "name": "rss", "ts": "abc"}]}', "`traceEvents[0].ts`", "'abc'"),
        (
            '{"traceEvents": [{"ph": "M", "name": "x"}, {"ph": "C", "ts": null}]}',
            "`traceEvents[1].ts`",
            "None",
        ),
        ('{"traceEvents": [{"ph": "C", "ts": 1e999}]}', "`traceEvents[0].ts`", "inf"),
        ('{"traceEvents": [{"ph": "C", "ts": true}]}', "`traceEvents[0].ts`", "True"),
        ('{"traceEvents": [{"ph": "C", "ts": ' + "9" * 400 + "}]}", "`traceEvents[0].ts`", "999"),
        ('{"baseTimeNanoseconds": "5", "traceEvents": []}', "`baseTimeNanoseconds`", "'5'"),
        ('{"baseTimeNanoseconds": null, "traceEvents": []}', "`baseTimeNanoseconds`", "None"),
        ('{"baseTimeNanoseconds": 1e999, "traceEvents": []}', "`baseTimeNanoseconds`", "inf"),
        ('{"baseTimeNanoseconds": -3, "traceEvents": []}', "`baseTimeNanoseconds`", "-3"),
    ],
)
def test_a_wrong_typed_value_is_one_line_naming_file_and_field(tmp_path, capsys, text, field, shown):
    # GIVEN a rank trace that is valid JSON with a value of the wrong type
    path = tmp_path / "memory_trace_rank_0.json"
    path.write_text(text)
    # WHEN merged
    code = main(["merge-traces", str(tmp_path), "-o", str(tmp_path / "m.json")])
    # THEN exit 2 and one line naming the file, the field and the bad value, no output written
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{str(path)!r}: {field} is {shown}" in err
    assert "regenerate the file" in err
    assert not (tmp_path / "m.json").exists()


def test_an_integral_float_base_and_integer_ts_still_merge(tmp_path):
    # GIVEN a base written as a float with no fraction and an integer ts (both valid Chrome traces)
    (tmp_path / "memory_trace_rank_0.json").write_text(
        '{"baseTimeNanoseconds": 2000.0, "traceEvents": [{"ph": "C", "name": "rss", "ts": 7, "args": {"b": 1}}]}'
    )
    assert main(["merge-traces", str(tmp_path), "-o", str(tmp_path / "m.json")]) == 0
    import json

    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["baseTimeNanoseconds"] == 2000
    assert [e["ts"] for e in merged["traceEvents"] if e["ph"] == "C"] == [7.0]
