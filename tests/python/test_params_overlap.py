"""offload_parameters over a slow link: prefetching ahead hides the staging (window 2), fetching
at use (window 0) stalls for every block. Runs in a child process, for the emulated device reads
its link (TIERFLOW_EMU_LINK) when the process first opens it."""
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, sys, time, torch
    from torch import nn
    from tierflow.torch import offload_parameters
    torch.manual_seed(int(sys.argv[1]))
    torch.set_num_threads(1)
    width, blocks = 256, 6
    # Rows enough that a block's forward lasts 3 x its copy (257 KiB at 0.1 GB/s: 2.6 ms), so
    # that a window ahead can hide it, on any torch: PyPI's torch 2.x runs this Linear ~40 x
    # faster than Debian's 1.13.
    probe, x = nn.Linear(width, width), torch.randn(256, width)
    probe(x)
    start = time.perf_counter()
    for _ in range(5):
        probe(x)
    seconds_per_row = (time.perf_counter() - start) / 5 / 256
    rows = min(16384, max(256, int(3 * 2.6e-3 / seconds_per_row)))
    out = {}
    for window in (0, 2):
        model = nn.Sequential(*[nn.Linear(width, width) for _ in range(blocks)])
        with offload_parameters(model, blocks=list(model), window=window) as h:
            x = torch.randn(rows, width)
            for _ in range(3):
                model(x).square().mean().backward()
            out[window] = h.metrics()
    print(json.dumps({w: {k: m[k] for k in ("stall_s", "compute_s", "bytes_in")}
                      for w, m in out.items()}))
""")


def test_a_window_ahead_hides_the_staging_that_window_0_stalls_on(seed):
    env = dict(os.environ, TIERFLOW_EMU_LINK="h2d=0.1GB/s,d2h=0.1GB/s,latency=10us")
    run = subprocess.run([sys.executable, "-c", CHILD, str(seed)], env=env, check=True,
                         capture_output=True, text=True, timeout=120)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    at_use, ahead = got["0"], got["2"]
    print(got)
    # every block staged forward and backward, but a window ahead keeps the last block's
    # forward staging for its backward step
    block = 257 * 1024
    assert at_use["bytes_in"] >= ahead["bytes_in"] >= at_use["bytes_in"] - 3 * block > 0
    # window 0 waits for every block's copy: 257 KiB at 0.1 GB/s is ~2.6 ms a block
    copy_s = at_use["bytes_in"] / 0.1e9
    assert at_use["stall_s"] >= 0.5 * copy_s
    assert ahead["stall_s"] < 0.5 * at_use["stall_s"]
