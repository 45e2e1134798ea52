"""Benchmarks of the EVS serving engine. Run from the repository root.

    python -m bench [--quick]              # every serving scenario: tables, one JSON, one PNG
    python -m bench --plot RESULT.json     # redraw the PNG of a saved run
    python -m bench.gpu_check              # the first thing to run on new GPU hardware
    python -m bench.accuracy               # answer accuracy of the shapes models against q
(`python bench/gpu_check.py` and `python bench/accuracy.py` work as well.)

Modules, one concern each:
  workload      what is measured: clips, sampling, answer length, the sizes of each scenario
  bursts        serving N users on the engine at once, and the run records every scenario shares
  peer          the same users served the stock-transformers way (processor + generate + streamer)
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
  targets       the issues' targets beside the measured figures
  environment   machine, device, model, versions, git commit
  runner        runs every scenario and assembles the report
  report        the markdown tables and the JSON file
  markdown      table formatting
  plot          the PNG (TTFT vs q; mean TTFT vs users, engine and peer)
"""
