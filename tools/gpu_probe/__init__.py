"""The pieces of ``tools/gpu_estimate_peak.py``: ``history`` (a history replayed, grouped, diffed),
``compare`` (real against estimate), ``real`` (the CUDA run, or a CPU stand-in), ``estimate_log``
(the estimate logged the same way), ``report`` (the text)."""
