"""``memprofiler estimate CONFIG`` for configs that are not causal LMs: an encoder-decoder (T5) is
built with its sequence-to-sequence head and trained on its own loss, and the output names the
class built.

The tiny T5 below has 196,864 parameters: the shared embedding 500 x 64 (tied to the head); per
encoder layer self-attention q, k, v, o (4 x 64 x 64) and feed-forward wi, wo (2 x 64 x 128), two
norms (2 x 64); per decoder layer the same plus cross-attention (4 x 64 x 64) and a third norm;
the relative position bias (32 x 4) of each stack's first layer and each stack's final norm (64).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from memprofiler.__main__ import main
from memprofiler.estimate.named import load_model

ENCODER_LAYER = 4 * 64 * 64 + 2 * 64 * 128 + 2 * 64
DECODER_LAYER = 8 * 64 * 64 + 2 * 64 * 128 + 3 * 64
T5_PARAMS = 500 * 64 + 2 * (ENCODER_LAYER + DECODER_LAYER) + 2 * (32 * 4 + 64)
T5 = {
    "model_type": "t5",
    "d_model": 64,
    "d_ff": 128,
    "d_kv": 16,
    "num_layers": 2,
    "num_heads": 4,
    "vocab_size": 500,
}


@pytest.fixture
def t5(tmp_path: Path) -> Path:
    (tmp_path / "t5").mkdir()
    (tmp_path / "t5" / "config.json").write_text(json.dumps(T5))
    return tmp_path / "t5"


def test_an_encoder_decoder_gets_its_seq2seq_head_and_a_decoder_batch(t5):
    # GIVEN a T5 config (transformers 5 writes it without `decoder_start_token_id`)
    # WHEN it is loaded as the command loads it
    named = load_model(str(t5))
    # THEN it is the model with the LM head, trained on its own loss
    assert type(named.model).__name__ == "T5ForConditionalGeneration"
    assert named.built == "T5ForConditionalGeneration, transformers' AutoModelForSeq2SeqLM.from_config"
    assert named.takes_labels and named.encoder_decoder
    # AND the decoder gets the ids itself, so no start token is needed to shift the labels
    batch = named.batch(2, 8)
    assert set(batch) == {"input_ids", "decoder_input_ids", "labels"}
    assert batch["decoder_input_ids"] is batch["input_ids"]
    assert sum(p.numel() for p in named.model.parameters()) == T5_PARAMS == 196_864


def test_checkpointing_uses_transformers_current_entry_without_a_warning(t5):
    named = load_model(str(t5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        how = named.checkpoint()
    assert how == "activation checkpointing: transformers' activation_checkpointing_enable (non-reentrant)"


def test_t5_is_estimated_from_the_command_line(t5, tmp_path, capsys):
    # WHEN a T5 config is estimated in one command (it stopped in T5's decoder before)
    out = tmp_path / "out"
    rc = main(
        ["estimate", str(t5), "--seq-len", "16", "--batch-size", "1", "--jobs", "1", "--save-dir", str(out)]
    )
    printed = capsys.readouterr().out
    # THEN the float32 parameters and AdamW's two moments are the model's
    assert rc == 0
    [est] = yaml.safe_load((out / "memory_estimate.yaml").read_text())["estimates"]
    assert est["resident"]["parameters"] == 4 * T5_PARAMS
    assert est["resident"]["optimizer_state"] == 2 * 4 * T5_PARAMS
    # AND the output names the class built and the loss trained
    assert (
        "note: model: T5ForConditionalGeneration, transformers' AutoModelForSeq2SeqLM.from_config" in printed
    )
    assert "note: loss: the model's own, from `labels` (the input ids)" in printed
