"""Check every config of the reference kernels, time each candidate at the real MLP shapes, and
write the tuned table the kernels read (reference_kernels/tuning/pick.py).

A run, on the GPU the table is for, writes its files to the output directory ``<out>`` (the
``OUT`` environment variable, else /tmp):

1. correctness: every config of linear_act and gated_act, forced one by one, in float16, bfloat16
   and float32 (where its pipeline does not fit the GPU's shared memory, with the fewer stages
   configs.candidates offers it with; skipped if none fit), at odd shapes (M, K, N not tile multiples, one
   transposed weight) and one shape with 16-byte rows so TMA configs run their descriptor
   kernel, against a float64 golden; the kernel's relative Frobenius error must stay within 2x
   eager's own error (or a floor per dtype). Configs compile in a process pool, which also fills
   Triton's disk cache for the sweep (compiles dominate a cold run).
2. sweep: at every real shape of reference_kernels.models.shapes (up projections; tokens 1..8192; bf16
   and fp16) every candidate config (configs.candidates) and eager PyTorch are timed in
   interleaved rounds by pytest-fusion's own GPU timer (CUDA-graph replay, L2 flushed before each
   replay); the fastest config per tuning key becomes the table's pick. Keys whose eager time
   reaches ``--sustained-ms`` are ranked again with each provider replayed back to back
   (time_sustained), and the ``--bench-top`` fastest there by their speedup over eager in
   benchmark mode itself (time_benchmark_mode), the regime the gate judges. A config that failed
   any check (wrong result, compile error, crashed or hung worker) is never timed.
3. the table: ``<out>/<device>.json`` (copy it to reference_kernels/tuning/tables/ to commit it),
   then the whole seed GeGLU MLP timed with the new picks against eager and torch.compile.

Writes ``<out>/tune_kernels.json`` (saved after every shape, so a timeout keeps what finished).
``--smoke`` runs the same code on the CPU under the Triton interpreter at tiny shapes.
``--cases REGEX --base-table TABLE`` checks and times only some cases and keeps the table's
other picks (the table records which keys it re-timed). ``--from-cache`` times nothing: it writes
``<out>/<device>.json`` from this machine's run-time tuning cache for the GPU
(reference_kernels/tuning/cache.py), picks made by ``triton.testing.do_bench`` rather than this sweep.

    python3 -m reference_kernels.tune            # on the H200
    python3 -m reference_kernels.tune --cases '^llama3-70b-M8192$' \
        --base-table reference_kernels/tuning/tables/nvidia-h200.json
    TRITON_INTERPRET=1 python3 -m reference_kernels.tune --smoke
    python3 -m reference_kernels.tune --from-cache   # the picks run-time tuning cached here
"""
