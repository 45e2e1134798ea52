"""The Gradio user interface of EVS Video Chat, and the other faces of the same server.

    demo = ui.build_demo(engine, banner=None, delete_cache=(every_s, older_than_s))  # queue configured
    cleaner = ui.start_cleaner(demo, every_s, older_than_s, max_bytes)   # also the images Gradio does not track
    routes = ui.openai_routes(engine, max_file_bytes, fetch_video_urls=False)   # /v1/chat/completions, /v1/models
    routes += ui.live_routes(engine, max_source_pixels, idle_s)   # the /v1/live WebSocket (docs/live.md)
    demo.launch(app_kwargs={"routes": routes}, **ui.launch_kwargs(max_file_bytes))   # MCP server on
    cleaner.stop()

Gradio's MCP server (streamable HTTP at /gradio_api/mcp/) lists one tool, `answer_video_question`
(ui/mcp_tool.py, also the API endpoint of that name); `/ask` and `/sweep` are API endpoints only.

API endpoint `/ask` (gradio_client: `client.submit(..., api_name="/ask")`)
------------------------------------------------------------------------
Inputs, in order (all after the first three have defaults):
    video                 file (gradio_client.handle_file(path)); required
    question              str; required
    pruning_rate          float q, at least 0 and below 1: the fraction of video tokens dropped (default: the
                          model's, engine.model_info["default_pruning_rate"])
    fps                   float, frames sampled per second of video (default 2.0)
    max_frames            int, cap on sampled frames (default by device: 32 on a CPU, 128 on a GPU)
    max_pixels_per_frame  int, cap on height*width of each frame (default by device: 50176 = 224*224 on a
                          CPU, 200704 = 448*448 on a GPU); the three sampling defaults are the engine's
                          `default_frame_sampling`, and on a GPU a video over its memory plan is refused with
                          a sentence that says to choose fewer frames or fewer pixels per frame
    max_new_tokens        int (default 128)
    temperature           float, 0 decodes greedily (default 0.0)
    compare               bool, also answer at q=0 (default False)
    history               list of [question, answer] pairs asked earlier about the same video (default []);
                          the engine then reuses its feature and prefix caches
    enable_thinking       bool, think before answering (default False), for a model that can
                          (engine.model_info["thinks"]: Qwen3.5, Qwen3.6, Nemotron-H Omni); others ignore it
    hear_soundtrack       bool, give the model the video's soundtrack beside its frames (default: on for a model
                          with an audio tower, engine.model_info["hears"]: Nemotron-H Omni); others ignore it,
                          and the stats say "unsupported"
    pruning_method        str, which video tokens are dropped: "evs" (default), "vidcom2" or "uniform"
    compare_methods       bool, also answer with the other pruning methods at the same q (default False)
    media                 list of files (handle_file each): more videos and pictures asked about after `video`,
                          in order (default none); at most engine.model_info["max_media"] in all
    skip_still_patches    bool, patches that did not change since they were last encoded skip the vision tower
                          and the prompt (default: GenerationParams.skip_still_patches), for a model whose tower
                          can (engine.model_info["skips_still_patches"]: the Qwen families); others ignore it

Outputs, streamed as a tuple (answer, stats, figures, frames):
    answer   str: the answer so far at `pruning_rate`.
    stats    dict: {"status": "<what the engine is doing>"} while the request is under way (while the model
             thinks, {"status": "thinking", "thinking": "<the thinking so far>"}); in the final update the stats
             dict with the docs/architecture.md keys (engine.stats.STATS_KEYS). With enable_thinking=True it has
             one more key, "thinking": str, what the model thought before the answer; with compare=True,
             "compare": {"pruning_rate": 0.0, "answer": str, "stats": {...same keys...}}; with
             compare_methods=True, "compare_methods": {method: {"answer": str, "stats": {...}}} for every
             method (pruning.PRUNING_METHODS order), the chosen one included.
    figures  dict of two plotly figures as JSON, {"tokens_per_group": ..., "dissimilarity": ...}
             (rebuild with plotly.io.from_json(json.dumps(...))), the first video's; with several videos also
             "videos": [{"medium": the video's place among the uploads, "tokens_per_group", "dissimilarity"}];
             updated as each video's picture arrives, before the first token.
    frames   gallery: one image per temporal group of every video, pruned patches dimmed and tinted, captioned
             "t=1.2 s · kept 12/49" ("video 3 · t=1.2 s · kept 12/49" with several uploads).
An intermediate update carries {"__type__": "update"} for an output that did not change; the final
result always carries all four. User errors (no video, empty question, unreadable / too long / too
large video, bad settings, server busy) come back as errors whose message is one sentence, the one every
other way in gives for the same mistake (engine/front/door.py); the numbers have no slider's ends here.

API endpoint `/sweep` (gradio_client: `client.predict(video, question, api_name="/sweep")`)
--------------------------------------------------------------------------------------------
The question answered at several pruning rates, with one pruning method or several (each at every rate), as
one burst (one read of the uploads, one ViT forward, the answers decoding together). Inputs: video, question,
then with defaults rates ("0, 0.3, 0.5, 0.7, 0.9", or a list of numbers; at most 8), fps, max_frames,
max_pixels_per_frame (None: the device's defaults), max_new_tokens (128), temperature (0.0), enable_thinking
(False: a model that can think does so first at every rate), hear_soundtrack (as for `/ask`: every rate hears
it), methods ("evs", or "evs, vidcom2, uniform" or a list of names; rates times methods at most 16), media and
skip_still_patches (as for `/ask`). Streams (table, figure, answers_html); the final result holds:
    table         {"headers": [...], "data": [[q, method, answer, video tokens kept, video tokens total,
                  prompt tokens, TTFT (s), prefill (s), ViT (s), requests in the ViT forward, total (s)], ...]}
    figure        the plot of kept tokens and TTFT against q, per method when there are several
                  ({"type": "plotly", "plot": "<json>"})
    answers_html  the answers side by side, as shown on the page
"""

from ui.layout import build_demo, default_banner, launch_kwargs
from ui.live_socket import live_routes
from ui.openai_api import openai_routes
from ui.temp_files import start_cleaner

__all__ = ["build_demo", "default_banner", "launch_kwargs", "live_routes", "openai_routes", "start_cleaner"]
