"""Prompt normalisation, the in-process tokenizer (tiny preset) and padding to the batch's longest."""

from __future__ import annotations

import pytest

from reproduction.errors import InputNotFoundError
from reproduction.recap.tokenizer import encode_prompts, format_prompt, load_tokenizer, normalize_task, train_tokenizer

TASKS = ["Push the red cube to the GREEN marker.", "pick_and_place the block\n", "open the drawer!"]


def test_normalisation_and_template_follow_recap():
    assert normalize_task("  Pick_and_place the Block.\n") == "pick and place the block"
    assert normalize_task("open the drawer!!") == "open the drawer!"  # only one trailing punctuation char
    assert format_prompt("Push_it.") == "Task: push it."
    # RLinf's value prompt keeps a closing quote (image_text_processing.py _strip_trailing_punctuation)
    assert format_prompt('put the "alphabet soup" in the basket "') == 'Task: put the "alphabet soup" in the basket ".'
    assert format_prompt("open the drawer'") == "Task: open the drawer'."


def test_trained_tokenizer_round_trips_and_loads_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    tok = train_tokenizer(TASKS, tmp_path / "tok", vocab_size=400)
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    again = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    for task in TASKS + ["an unseen task with Ünïcode and digits 123"]:
        text = format_prompt(task)
        ids = again(text)["input_ids"]
        assert ids[0] == again.bos_token_id == 1 and tok(text)["input_ids"] == ids
        assert again.decode(ids, skip_special_tokens=True) == text  # byte-level: lossless, no <unk>
    assert tok.pad_token_id == 0 and len(tok) <= 400


def test_training_is_deterministic_for_the_same_task_set(tmp_path):
    train_tokenizer(TASKS, tmp_path / "a")
    train_tokenizer(list(reversed(TASKS)) + TASKS, tmp_path / "b")
    assert (tmp_path / "a/tokenizer.json").read_bytes() == (tmp_path / "b/tokenizer.json").read_bytes()


def test_prompts_are_padded_to_the_longest_in_the_batch_not_to_200(tmp_path):
    tok = train_tokenizer(TASKS, tmp_path / "tok")
    prompts = [format_prompt(TASKS[0]), format_prompt("x")]
    ids, mask = encode_prompts(tok, prompts)
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    assert ids.shape == mask.shape == (2, max(lengths)) and max(lengths) < 40
    assert mask.sum(1).tolist() == lengths
    assert ids[1, lengths[1] :].eq(0).all() and ids[0].tolist() == tok(prompts[0])["input_ids"]
    ids, _ = encode_prompts(tok, prompts, max_len=5)
    assert ids.shape == (2, 5)


def test_missing_tokenizer_json_is_a_clear_error(tmp_path):
    with pytest.raises(InputNotFoundError, match="tokenizer.json does not exist") as err:
        load_tokenizer(tmp_path)
    assert err.value.exit_code == 3
