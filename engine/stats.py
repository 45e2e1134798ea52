"""The per-request stats dict: its keys are a public contract (UI, tests, benchmarks)."""

STATS_KEYS = (
    "pruning_rate",  # q the request asked for
    "frames_sampled",  # video frames taken from the file
    "grid_thw",  # [T, h, w] in LLM tokens
    "video_tokens_total",  # T*h*w before EVS
    "video_tokens_kept",  # after EVS
    "tokens_kept_per_frame",  # list, one count per temporal group
    "prompt_tokens",  # tokens the language model saw for the prompt (after pruning)
    "prefill_tokens",  # of those, the ones prefilled now (the rest came from the prefix KV cache)
    "generated_tokens",
    "ttft_s",  # submit -> first answer token
    "total_s",  # submit -> done
    "decode_video_s",  # file decode + frame sampling + HF processor
    "vit_s",  # the vision forward this request took part in
    "evs_s",
    "prefill_s",
    "decode_s",  # first token -> done
    "vit_batch_requests",  # requests that shared the ViT forward
    "vit_cache_hit",
    "prefix_cache_hit",
    "decode_batch_max",  # most requests in one decode step with this one
)
