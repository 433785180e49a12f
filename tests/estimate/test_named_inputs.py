"""``memprofiler estimate module:factory`` for a model that takes no tokens (``--input-shape``), and a
factory module that fails: one line naming it, exit code 2.

The CNN below has 7,626 parameters: the stem 3 x 16 x 3 x 3 + 16, three blocks of a 16 x 16 x 3 x 3
convolution without bias and a batch norm (2 x 16), and the head 16 x 10 + 10.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from torch import nn

from memprofiler.__main__ import main

CNN_PARAMS = 3 * 16 * 9 + 16 + 3 * (16 * 16 * 9 + 2 * 16) + 16 * 10 + 10


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def cnn() -> nn.Module:
    """A factory for ``module:factory``: images in, ten logits out, no vocabulary."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        *(Block(16) for _ in range(3)),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


@pytest.fixture
def here(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def test_a_cnn_is_estimated_from_its_input_shape(here, tmp_path, capsys):
    # WHEN a CNN factory is estimated with rows of 3 x 32 x 32 images
    out = tmp_path / "out"
    argv = ["estimate", "test_named_inputs:cnn", "--input-shape", "3,32,32", "--batch-size", "2"]
    rc = main([*argv, "--precision", "32-true", "--jobs", "1", "--save-dir", str(out)])
    printed = capsys.readouterr().out
    # THEN it runs (it stopped at "no vocabulary" before) with the model's float32 parameters
    assert rc == 0
    [est] = yaml.safe_load((out / "memory_estimate.yaml").read_text())["estimates"]
    assert CNN_PARAMS == 7_626
    assert est["resident"]["parameters"] == 4 * CNN_PARAMS
    assert est["resident"]["optimizer_state"] == 2 * 4 * CNN_PARAMS
    assert "note: batch: rows of 3 x 32 x 32 float32 (--input-shape); loss: the output summed" in printed


def test_without_an_input_shape_the_line_names_the_flag(here, capsys):
    assert main(["estimate", "test_named_inputs:cnn", "--seq-len", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give the shape of one input row (`--input-shape 3,224,224`" in err


def test_a_module_that_trains_when_imported_is_one_line(tmp_path, monkeypatch, capsys):
    # GIVEN a training script with its factory, which runs at import and fails there
    (tmp_path / "train_script.py").write_text(
        "import sys\n\ndef build():\n    return None\n\nBATCH = int(sys.argv[1])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("sys.argv", ["memprofiler", "estimate"])
    # WHEN it is named as the model
    rc = main(["estimate", "train_script:build", "--seq-len", "8"])
    err = capsys.readouterr().err
    # THEN one line names the module, the error and its line, and the way out (a traceback before)
    assert rc == 2 and err.count("\n") == 1, err
    assert (
        "'train_script:build': importing `train_script` raised ValueError: invalid literal for int() with "
        "base 10: 'estimate' (train_script.py:6); a module that trains when imported needs "
        '`if __name__ == "__main__":` around that code' in err
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["test_named_inputs:Block"],
            "'test_named_inputs:Block': calling it raised TypeError: Block.__init__() missing 1 required "
            "positional argument: 'c'; give a function or class that builds the model with no arguments",
        ),
        (
            ["Qwen/Qwen2-7B"],
            "'Qwen/Qwen2-7B' is neither a file or directory (a Hugging Face config.json) nor module:factory; "
            'for a Hugging Face Hub model, save its config once where the network is: python -c "from '
            "transformers import AutoConfig; AutoConfig.from_pretrained('Qwen/Qwen2-7B')"
            ".save_pretrained('Qwen2-7B')\", then: memprofiler estimate Qwen2-7B",
        ),
        (
            ["test_named_inputs:cnn", "--input-shape", "3,32,x"],
            "`--input-shape`: got '3,32,x'; give one input row's shape, e.g. 3,224,224",
        ),
    ],
)
def test_bad_factories_and_shapes_are_one_line(here, capsys, args, message):
    assert main(["estimate", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_checkpointing_a_model_built_of_sequentials(here, tmp_path, capsys):
    # WHEN a model with no nn.ModuleList (an nn.Sequential of blocks) is estimated with checkpointing
    out = tmp_path / "out"
    argv = ["estimate", "test_named_inputs:cnn", "--input-shape", "3,32,32", "--batch-size", "8"]
    rc = main([*argv, "--checkpointing", "both", "--jobs", "1", "--save-dir", str(out)])
    printed = capsys.readouterr().out
    # THEN each item of the Sequential is checkpointed (it was refused), and the step keeps less
    assert rc == 0
    assert "checkpoint_wrapper on each of the 7 items of the model (Sequential)" in printed
    off, on = yaml.safe_load((out / "memory_estimate.yaml").read_text())["estimates"]
    assert (off["checkpointing"], on["checkpointing"]) == (False, True)
    assert on["by_category"]["activations"] < off["by_category"]["activations"]
