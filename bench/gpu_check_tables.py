"""The GPU check's printout (bench/gpu_check.py): one table per figure, each target's verdict in a "met" column
where its figure is printed, and every target together at the end."""

from engine.memory.dims import GIB

from .live import markdown as live_markdown
from .markdown import cell
from .pruning_time import markdown as pruning_markdown
from .targets import markdown as targets_markdown
from .targets import met_cell
from .vision_skip import kinds_markdown


def print_tables(report: dict, pruning_rate: float) -> None:
    """Print every table of a GPU check report; pruning_rate: the q of the pruning methods' table."""
    host, model, targets = report["host"], report["model"], report["targets"]
    print(f"\n## GPU check: {model['name']} on {report['device']}")
    print(
        f"{host['summary']}; transformers {report['versions']['transformers']}; "
        f"attention: vision {model['attn_vision']}, language model {model['attn_text']}"
        + (f", linear-attention layers {model['attn_linear']}" if model.get("attn_linear") else "")
        + "; "
        f"dtype {model['dtype']}; load {report['load_s']:.1f} s; each request alone and the arrival burst the "
        f"median of {report['repeats']} runs\n"
    )
    print("| q | video tokens kept/total | decode s | ViT s | EVS s | prefill s | TTFT s | ideal s | TTFT/ideal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report["ttft_by_rate"]:
        print(
            f"| {r['pruning_rate']} | {r['video_tokens_kept']}/{r['video_tokens_total']} | {r['read_video_s']:.3f} "
            f"| {r['vit_s']:.3f} | {r['evs_s']:.4f} | {r['prefill_s']:.3f} | {r['ttft_s']:.3f} "
            f"| {r['ideal_ttft_s']:.3f} | {r['ttft_over_ideal']:.2f} |"
        )
    print(
        "\n| reading, q = 0 | frames | waiting for a reader s | reading s | rest of TTFT s | TTFT s | reading's share |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in report["reading"]:
        print(
            f"| {r['video']} | {r['frames_sampled']} | {r['read_wait_s']:.4f} | {r['read_s']:.3f} | {r['rest_s']:.3f} "
            f"| {r['ttft_s']:.3f} | {100 * r['read_share']:.0f} % |"
        )
    vit = report["vit"]
    print(f"\n| ViT over {vit['videos']} videos ({vit['patches_per_video']} patches each) | seconds |\n|---|---|")
    print(
        f"| one forward | {vit['one_forward_s']:.3f} |\n| {vit['videos']} separate forwards | "
        f"{vit['separate_forwards_s']:.3f} |\n| ratio | {vit['ratio']:.3f} |"
    )
    print("\nPruning methods: " + pruning_markdown(report["pruning_methods"], pruning_rate, targets))
    print_bursts(report)
    print(f"\n## Live sessions\n\n{live_markdown(report['live'], targets)}\n")
    kinds = report["vision_skip"]["kinds"]
    print(f"## The vision tower: exact reuse and still patches skipped, q = 0.7\n\n{kinds_markdown(kinds, targets)}\n")
    shares = ", ".join(f"{r['kind']} {r['way']} {r['vit_s'] / (r['vit_s'] + r['prefill_s']):.2f}" for r in kinds)
    print(f"ViT share of ViT + prefill: {shares}\n")
    print("## Targets\n\n" + targets_markdown(targets))
    print(
        f"\npeak GPU memory: {report['peak_gpu_memory_gib']} GiB"
        if report["peak_gpu_memory_gib"] is not None
        else "\npeak GPU memory: n/a (CPU)"
    )
    plan = report["memory_plan"]
    if plan["free_bytes"] is not None:
        print(
            f"memory plan: {plan['free_bytes'] / GIB:.1f} GiB free after loading, {plan['cache_summary']}, at most "
            f"{plan['max_video_tokens']} video tokens per request, {plan['max_running']} decoding together"
        )


def print_bursts(report: dict) -> None:
    """The bursts read before admission, and the burst admitted as read against the pipelined ideal with its
    users' stages."""
    print(
        f"\n| {report['bursts'][0]['users']} users at once | mean TTFT s | wall s | output tokens/s | ViT batch "
        "| decode batch |\n|---|---|---|---|---|---|"
    )
    for b in report["bursts"]:
        print(
            f"| q = {b['pruning_rate']} | {b['mean_ttft_s']:.3f} | {b['wall_s']:.2f} | "
            f"{b['output_tokens_per_s']:.1f} | {b['vit_batch_requests_max']} | {b['decode_batch_max']} |"
        )
    arrival = report["arrival_burst"]
    print(
        f"\n| {arrival['users']} users at once, q = 0, admitted as read | mean TTFT s | pipelined ideal s | "
        f"mean TTFT/ideal | wall s | runs | met |\n|---|---|---|---|---|---|---|"
    )
    print(
        f"| as in serving | {arrival['mean_ttft_s']:.3f} | {arrival['pipelined_ideal_s']:.3f} | "
        f"{cell(arrival['ttft_over_ideal'], 2)} | {arrival['wall_s']:.2f} | median-wall of {arrival['runs']} | "
        f"{met_cell(report['targets'], 'arrival_burst', arrival)} |"
    )
    print(
        "\n| its users, by first token | TTFT s from the burst's start | read and processor s (waiting) "
        "| ViT s (users) | prefill s |"
        "\n|---|---|---|---|---|"
    )
    for rank, u in enumerate(arrival["per_user"], 1):
        print(
            f"| {rank} | {u['ttft_s']:.3f} | {u['read_video_s']:.3f} ({u['read_wait_s']:.3f}) | "
            f"{u['vit_s']:.3f} ({u['vit_batch_requests']}) | {u['prefill_s']:.3f} |"
        )
