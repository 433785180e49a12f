"""The estimate's notes under a table of several rows: a note that only some rows have names them,
so a figure in it (bytes released, a pool's peak) is read beside its own row."""

from __future__ import annotations

from memprofiler.estimate.output import render_table
from memprofiler.estimate.result import MemoryEstimate

GIB = 2**30


def _row(batch: int, notes: list[str]) -> MemoryEstimate:
    return MemoryEstimate(
        peak_bytes=batch * GIB, tensor_peak_bytes=batch * GIB, batch_size=batch, notes=notes
    )


def test_a_note_of_some_rows_names_them_and_a_shared_one_is_said_once():
    # GIVEN three rows, without and with checkpointing: one note shared, the others each row's own
    rows = [
        _row(1, ["target: H100 (sm90), torch 2.13", "pools: default 5 B"]),
        _row(1, ["target: H100 (sm90), torch 2.13", "checkpointing on", "pools: default 3 B"]),
        _row(12, ["target: H100 (sm90), torch 2.13", "checkpointing on", "released 7 B"]),
    ]
    # WHEN the table is rendered with the column that tells the rows apart
    text = render_table(rows, 80 * GIB, 0, ("checkpointing", ["off", "on", "on"]))
    notes = [line for line in text.splitlines() if line.startswith("note")]
    # THEN the shared note is said once, plainly, and every other note names the rows it is of
    assert notes == [
        "note: target: H100 (sm90), torch 2.13",
        "note for batch 1 (checkpointing off): pools: default 5 B",
        "note for batch 1 (checkpointing on), batch 12 (checkpointing on): checkpointing on",
        "note for batch 1 (checkpointing on): pools: default 3 B",
        "note for batch 12 (checkpointing on): released 7 B",
    ]


def test_one_row_keeps_plain_notes():
    text = render_table([_row(2, ["target: H100", "released 7 B"])], None, 0)
    assert [line for line in text.splitlines() if line.startswith("note")] == [
        "note: target: H100",
        "note: released 7 B",
    ]


def test_a_search_notes_the_rows_the_answer_rests_on_and_says_where_the_rest_are():
    # GIVEN a search's six rows on a 10 GiB device, each with a note of its own: batches 1-5 fit
    rows = [_row(b, ["target: H100", f"released {b} B"]) for b in (1, 2, 3, 4, 5, 11)]
    # WHEN the table is rendered
    text = render_table(rows, 10 * GIB, 0)
    notes = [line for line in text.splitlines() if line.startswith("note")]
    # THEN the notes of some rows are those of the largest batch that fits and the first that does not
    assert notes == [
        "note: target: H100",
        "note for batch 5: released 5 B",
        "note for batch 11: released 11 B",
        "note: the notes of the 4 other rows are in each estimate's `notes` in memory_estimate.yaml",
    ]
