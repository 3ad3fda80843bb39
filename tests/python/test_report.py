"""examples/torch_report.py (the PyTorch main job's report), rendered by a real browser
(Debian's headless chromium): each chart draws one mark per series, bar or point, inside its
plot area, and the text is escaped."""
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from torch_report import write_html  # noqa: E402  (the example's, beside its one user)

CHROMIUM = shutil.which("chromium")


def render(path):
    """The DOM after load, as the browser serialises it."""
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", f"file://{path}"], capture_output=True, text=True,
                         timeout=120, check=True)
    return run.stdout


def random_steps(rng, n):
    tiers = {"weights in dram0": rng.randint(1, 2**24), "Adam <state> in cxl0": 3 * 2**24}
    steps = []
    for i in range(n):
        rec = {"step": i, "loss": 5.5 * (0.97 ** i) + rng.random(),
               "compute_s": rng.uniform(0.01, 0.2), "stall_s": rng.choice([0.0, 0.002]),
               "optimizer_s": rng.uniform(0.001, 0.02), "tiers": dict(tiers)}
        if i % 5 == 0:
            rec["val_loss"] = rec["loss"] + 0.3
        steps.append(rec)
    return steps


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/setup.sh installs it)")
def test_the_report_renders_every_mark_inside_its_chart(seed, tmp_path):
    rng = random.Random(seed)
    n = rng.randint(8, 40)
    steps = random_steps(rng, n)
    path = tmp_path / "report.html"
    write_html(str(path), "run <1> & co", ["loss 5.5 -> 1.2", "weights in <dram0>"], steps)
    dom = render(path)
    layout = json.loads(re.search(r'<pre id="layout">([^<]*)</pre>', dom).group(1))
    assert set(layout) == {"loss", "time", "tiers"}
    vals = sum("val_loss" in s for s in steps)
    assert layout["loss"]["marks"] == 1 + vals  # the loss line and each held-out point
    bars = sum(1 for s in steps for k in ("compute_s", "stall_s", "optimizer_s") if s[k] > 0)
    assert layout["time"]["marks"] == bars
    assert layout["tiers"]["marks"] == 2
    for chart in layout.values():
        x0, y0, x1, y1 = chart["drawn"]
        assert chart["shown"] == [640, 240]
        assert 0 <= x0 < x1 <= 640 and 0 <= y0 < y1 <= 240  # drawn, and inside the chart
        assert x1 - x0 > 400  # the series span the step axis
    # the text is there, escaped, not markup
    assert "run &lt;1&gt; &amp; co" in dom and "weights in &lt;dram0&gt;" in dom
    assert "Adam &lt;state&gt; in cxl0" in dom and "<state>" not in dom


def test_bad_steps_are_refused(seed, tmp_path):
    with pytest.raises(ValueError, match="no steps"):
        write_html(str(tmp_path / "r.html"), "t", [], [])
    steps = random_steps(random.Random(seed), 3)
    del steps[1]["stall_s"]
    with pytest.raises(ValueError, match=r"steps\[1\] has no 'stall_s'"):
        write_html(str(tmp_path / "r.html"), "t", [], steps)
    assert not (tmp_path / "r.html").exists()  # refused before writing
