"""Benchmarks of the EVS serving engine. Run from the repository root.

    python -m bench [--quick]              # every serving scenario: tables, one JSON, one PNG; exit 1 on a miss
    python -m bench --keep DIR --docs      # the same, and docs/performance.md's tables, .json and .png
    python -m bench --plot RESULT.json     # redraw the PNG of a saved run
    python -m bench.gpu_check              # the first thing to run on new GPU hardware
    python -m bench.accuracy               # answer accuracy of the shapes models against q
(`python bench/gpu_check.py` and `python bench/accuracy.py` work as well.)

Modules, one concern each:
  workload      what is measured: clips, sampling, answer length, the sizes of each scenario
  bursts        serving N users on the engine at once, and the run records every scenario shares
  peer          the same users served the stock-transformers way, in process (load_video + processor + generate
                + streamer)
  summary       mean / percentile figures of one run
  ttft_by_rate  one request's TTFT split by stage against q, with the ideal
  users         burst TTFT against the pipelined ideal and against the peer
  concurrency   TTFT percentiles, TPOT and throughput against concurrency and q
  follow_up     a follow-up question's TTFT against a cold one
  vit_timing    timing vision-tower forwards outside the engine (also used by gpu_check)
  vit_batching  one ViT forward over several videos against separate forwards
  reading       one request's reading (waiting for a reader, reading) against the rest of its TTFT
  decoding      video reading time of a long-GOP 1080p file and a short clip, a reader started per file
                against a warm pool of one and of one per core (also `python -m bench.decoding`)
  decoding_hook calls the decoding scenario when its module is there, and survives its failure
  live          live sessions: questions into a stream against uploads of it, sessions kept in real time
  live_ttft     questions asked into a stream pushed at its capture pace, and the uploads of it cut there
  live_work     the live scenario's sizes, recording, frames and quartiles
  gpu_check     the first thing to run on new GPU hardware; gpu_check_tables its printout
  targets       every target, its verdict (against a spread where the figure has one), the met column of each
                table, the exit status on a miss
  environment   machine, device, model, versions, git commit
  runner        runs every scenario and assembles the report
  report        the markdown tables, the JSON file, and docs/performance.md's tables from a run (--docs)
  markdown      table formatting
  plot          the PNG (TTFT vs q; mean TTFT vs users, engine and peer)
"""
