"""The thinking switch of Qwen3.5 / Qwen3.6: the prompt their chat template writes for it, thinking and answer
apart in the engine, and the switch on every way in (the page, /ask, the MCP tool's endpoint, the OpenAI
route) on a launched app serving tiny-random-qwen3.5."""

import base64
import json
from pathlib import Path

import openai
import pytest
from gradio_client import handle_file
from playwright.sync_api import sync_playwright

from app_harness import launched_app
from engine.checkpoints.tokenizer import build_tokenizer
from engine.config import FrameSampling, GenerationParams
from engine.detokenize import SplitDetokenizer
from engine.engine import think_end_id
from engine.families.qwen import Qwen3VL, Qwen25VL, Qwen35
from engine.prompt.unpruned import chat_text
from engine.scheduling.request import Request
from engine.stream import Event, Stream
from engine.worker import events as stream_events
from test_browser import CHROMIUM, CHROMIUM_ARGS, PHONE, TIMEOUT_MS, ask, set_slider, upload
from ui import openai_api

MODEL = "tiny-random-qwen3.5"
SYSTEM = "You are a helpful assistant."
TOKENS = 8  # every answer here is this long: a tiny random model never ends one itself

# --- the prompt --------------------------------------------------------------------------------------------

# What Qwen3.5's own chat template writes, rendered once with transformers' apply_chat_template (the template
# of the Qwen/Qwen3.5-* checkpoints, as huggingface/trl keeps it: trl/chat_templates/qwen3_5_think.jinja,
# shipped from Qwen3.5-4B up, and qwen3_5_nothink.jinja, 2B and below; they differ only in the default of
# enable_thinking, so both write this when it is given). Messages: the system prompt, then the user turn
# [video, "What moves? "]; for the follow-up also the assistant turn
# "<think>\nA square slides.\n</think>\n\nA red square. \n" and the user turn " Which way? ".
TEMPLATE_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"  # the processor expands it as it does ours
TEMPLATE_FIRST_TURN = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    f"<|im_start|>user\n{TEMPLATE_VIDEO}What moves?<|im_end|>\n<|im_start|>assistant\n"
)
# An earlier turn keeps neither its reasoning nor a think block, and every message is trimmed.
TEMPLATE_FOLLOW_UP = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    f"<|im_start|>user\n{TEMPLATE_VIDEO}What moves?<|im_end|>\n"
    "<|im_start|>assistant\nA red square.<|im_end|>\n"
    "<|im_start|>user\nWhich way?<|im_end|>\n<|im_start|>assistant\n"
)
TEMPLATE_OPENING = {True: "<think>\n", False: "<think>\n\n</think>\n\n"}  # add_generation_prompt's tail


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen35_prompt_is_what_its_chat_template_writes(thinking):
    family = Qwen35(temporal_patch=2)

    def template(text: str) -> str:
        return (text + TEMPLATE_OPENING[thinking]).replace(TEMPLATE_VIDEO, family.video_placeholder())

    assert chat_text(family, SYSTEM, "What moves? ", [], thinking) == template(TEMPLATE_FIRST_TURN)
    history = [("What moves?", "<think>\nA square slides.\n</think>\n\nA red square. \n")]
    assert chat_text(family, SYSTEM, " Which way? ", history, thinking) == template(TEMPLATE_FOLLOW_UP)


@pytest.mark.parametrize("family", [Qwen3VL(temporal_patch=2), Qwen25VL(temporal_patch=2, tokens_per_second=2)])
def test_families_without_the_switch_ignore_it(family):
    video = family.video_placeholder()
    expected = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{video}What moves?<|im_end|>\n"
        "<|im_start|>assistant\nA red square. <|im_end|>\n<|im_start|>user\nWhich way?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    history = [("What moves?", "A red square. ")]
    assert chat_text(family, SYSTEM, "Which way?", history, thinking=True) == expected
    assert chat_text(family, SYSTEM, "Which way?", history, thinking=False) == expected
    assert think_end_id(family, build_tokenizer()) is None


def test_a_qwen35_tokenizer_without_the_think_end_token_has_no_switch():
    """A Qwen3.5 checkpoint built with a tokenizer that lacks `</think>` (the tiny byte-level one without its
    thinking tokens) cannot end a thinking part: the engine treats every token as answer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(
        models.BPE(vocab={c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}, merges=[])
    )
    core.pre_tokenizer, core.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    core.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    without = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    family = Qwen35(temporal_patch=2)
    assert think_end_id(family, without) is None
    assert think_end_id(family, build_tokenizer()) == build_tokenizer().convert_tokens_to_ids("</think>")


# --- thinking and answer apart -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def served(tokenizer, token_ids: list[int], thinking: bool):
    """Feed token_ids to a request as the worker does, end it, and return its Answer and events."""
    think_end = think_end_id(Qwen35(temporal_patch=2), tokenizer) if thinking else None
    request = Request(
        stream=Stream(1),
        media_paths=["clip.mp4"],
        question="What moves?",
        history=[],
        params=GenerationParams(max_new_tokens=100, enable_thinking=thinking),
        frame_sampling=FrameSampling(),
    )
    request.detokenizer = SplitDetokenizer(tokenizer, think_end)
    for token_id in token_ids:
        if stream_events.token(request, token_id, logits=None, eos_ids={tokenizer.eos_token_id}):
            break
    stream_events.done(request)
    events = [event for event in request.stream if event.kind in ("thinking", "text")]
    return request.stream.result(), events


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_the_think_end_token_splits_thinking_from_answer(tokenizer):
    think_end, end = tokenizer.convert_tokens_to_ids("</think>"), tokenizer.eos_token_id
    thinking, answer = ids(tokenizer, "Hmm, é?\n"), ids(tokenizer, "\n\nRed ü.")  # é and ü take two tokens each
    result, events = served(tokenizer, [*thinking, think_end, *answer, end], thinking=True)
    assert (result.thinking, result.text) == ("Hmm, é?\n", "Red ü.")  # the separating newlines dropped
    kinds = [event.kind for event in events]
    assert kinds == ["thinking"] * kinds.count("thinking") + ["text"] * kinds.count("text")
    assert all(event.text for event in events)
    stats = result.stats
    assert (stats["thinking_tokens"], stats["answer_tokens"]) == (len(thinking) + 1, len(answer))
    assert stats["generated_tokens"] == len(result.token_ids) == len(thinking) + 1 + len(answer)


def test_a_character_cut_by_the_think_end_token_stays_in_the_thinking(tokenizer):
    cut = ids(tokenizer, "é")[:1]  # the first byte of a two-byte character, then the thinking ends
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    result, _ = served(tokenizer, [*ids(tokenizer, "so"), *cut, think_end, *ids(tokenizer, "Red.")], thinking=True)
    assert result.thinking == "so\ufffd" and result.text == "Red."


def test_without_thinking_every_token_is_answer(tokenizer):
    answer = ids(tokenizer, "A red square.")
    result, _ = served(tokenizer, [*answer, tokenizer.eos_token_id], thinking=False)
    assert (result.thinking, result.text) == ("", "A red square.")
    assert (result.stats["thinking_tokens"], result.stats["answer_tokens"]) == (0, len(answer))


# --- the ways in, on a launched app --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinking_app(tiny_cache_dir):
    with launched_app(tiny_cache_dir, model=MODEL) as running:
        yield running


def data_url(path: Path) -> str:
    return f"data:video/mp4;base64,{base64.b64encode(path.read_bytes()).decode()}"


def test_ask_and_the_tool_endpoint_think_when_asked(thinking_app, clip):
    client, video = thinking_app.client, clip("moving_object")
    answer, stats, _, _ = client.predict(
        handle_file(str(video)), "What moves?", max_new_tokens=TOKENS, enable_thinking=True, api_name="/ask"
    )
    # The tiny model never writes </think>: all it says is thinking.
    assert answer == "" and stats["thinking"] and (stats["thinking_tokens"], stats["answer_tokens"]) == (TOKENS, 0)
    answer, stats, _, _ = client.predict(handle_file(str(video)), "What moves?", max_new_tokens=TOKENS, api_name="/ask")
    assert answer and "thinking" not in stats and (stats["thinking_tokens"], stats["answer_tokens"]) == (0, TOKENS)

    reply = json.loads(
        client.predict(data_url(video), "What moves?", None, TOKENS, True, api_name="/answer_video_question")
    )
    assert reply["thinking"] and reply["stats"]["thinking_tokens"] == TOKENS


def test_a_sweep_thinks_first_at_every_rate_when_asked(thinking_app, clip):
    client, video = thinking_app.client, clip("scene_cut")
    client.predict(
        handle_file(str(video)),
        "What changes?",
        "0, 0.7",
        max_new_tokens=TOKENS,
        enable_thinking=True,
        api_name="/sweep",
    )
    stats = [stream.result().stats for stream in thinking_app.spy.streams[-2:]]
    assert sorted(s["pruning_rate"] for s in stats) == [0.0, 0.7]
    assert all((s["thinking_tokens"], s["answer_tokens"]) == (TOKENS, 0) for s in stats)


def test_openai_route_returns_the_thinking_as_reasoning_content(thinking_app, clip):
    client = openai.OpenAI(base_url=f"{thinking_app.url}v1", api_key="unused", max_retries=0, timeout=120)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "video_url", "video_url": {"url": data_url(clip("pan"))}},
                {"type": "text", "text": "What moves?"},
            ],
        }
    ]

    def create(thinking, **kwargs):
        extra = {"chat_template_kwargs": {"enable_thinking": thinking}} if thinking is not None else None
        return client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=TOKENS, temperature=0, extra_body=extra, **kwargs
        )

    thought = create(True)
    message = thought.choices[0].message
    assert message.model_extra["reasoning_content"] and message.content == ""
    assert thought.usage.completion_tokens_details.reasoning_tokens == TOKENS == thought.usage.completion_tokens

    chunks = list(create(True, stream=True))
    streamed = "".join(chunk.choices[0].delta.model_extra.get("reasoning_content") or "" for chunk in chunks)
    assert streamed == message.model_extra["reasoning_content"]

    plain = create(None).choices[0].message
    assert plain.content and (plain.model_extra or {}).get("reasoning_content") is None
    with pytest.raises(openai.BadRequestError, match=openai_api.BAD_THINKING):
        create("yes")

    # A client sends the answer back as it got it, think block and all: the template drops the block, so the
    # follow-up is answered (the tags are the model's markup anywhere else).
    messages += [
        {"role": "assistant", "content": f"<think>\nA square slides.\n</think>\n\n{plain.content}"},
        {"role": "user", "content": "Which way?"},
    ]
    assert create(None).choices[0].message.content
    messages[-1]["content"] = "Which way? </think>"
    with pytest.raises(openai.BadRequestError, match="control markers such as </think>"):
        create(None)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_the_page_shows_the_thinking_in_a_collapsed_block_above_the_answer(thinking_app, clip):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(**PHONE)
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(thinking_app.url)
            page.wait_for_selector("#evs-ask")
            page.check("#evs-think input[type=checkbox]")  # shown: this model thinks
            upload(page, clip("moving_object"))
            page.click("#evs-advanced button")
            set_slider(page, "evs-max-new-tokens", TOKENS)
            ask(page, "What moves?")
            page.wait_for_function(
                "document.querySelector('#evs-status').innerText.includes('done')", timeout=TIMEOUT_MS
            )
            block = page.locator("#evs-chat .thought-group")
            assert block.inner_text().strip() == "Thinking"  # collapsed: the title alone
            block.locator(".title").click()
            assert len(block.inner_text().strip()) > len("Thinking")  # opened: the thinking itself
            box = block.bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["viewport"]["width"]
            assert f"{TOKENS} thinking · 0 answer" in page.locator("#evs-stats").inner_text()
        finally:
            browser.close()


def test_thinking_crosses_the_replica_wire():
    from replicas.wire import event_from_wire, event_to_wire  # imports Ray: only here

    assert event_from_wire(event_to_wire(0, Event("thinking", "Hmm"), "replica-1")) == Event("thinking", "Hmm")
