"""The main job in PyTorch: a small GPT-style decoder learns to write the licence texts Debian
ships (/usr/share/common-licenses, bytes as tokens), with its blocks' weights in a host tier
streamed into HBM block by block ahead of compute (offload_parameters) and its Adam state
offloaded (OffloadAdamW), while weights + Adam state are many times the HBM staging budget.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/torch_train_offload.py --verify

Runs on the GPU when torch sees one, else on the CPU (tierflow's emulated device, whose link
model caps the rate). Prints progress lines, then where the bytes lived, the prefetch overlap,
the link achieved against its bound and the optimizer's figures. --verify trains the same
model with nothing offloaded and checks that every loss and weight is bit-identical (the CPU's
compute is deterministic; on a GPU, cuBLAS may choose other kernels, so it compares within
1e-5 of the weights' scale), and prints the offloaded step's time over the resident one's.
Writes report.html (SVG plots), metrics.json and trace.json (Perfetto) to --out.
--overlap backward starts each param's Adam update as soon as its grad is final in the backward
pass (OffloadAdamW(overlap="backward")); backward_publish also writes each offloaded weight's
new values into its host tier then, not in step(); the summary prints the step() time left
after the backward pass either way. Default auto: backward_publish on a GPU, where it also frees
each offloaded weight's grad as soon as the optimizer has its host copy (so HBM never holds the
whole model's grads; the summary prints torch's HBM peak against the resident run's), and none
on the CPU, where the step is a few ms against a second of forward + backward, so overlap gains
nothing measurable (BENCHMARKS.md, issue 25).
--state-dtype bf16 or int8 stores the Adam moments compressed (OffloadAdamW(state_dtype=...),
cpu mode). --accuracy trains the same model (same seed, same data) once per state dtype, fp32,
bf16 and int8, for --steps (default 300) with its weights resident (streaming them changes no
bit: --verify), evaluates the held-out loss every --eval-every steps (default 20) on a fixed
held-out set of --eval-rows sequences (default 256), prints the curves as a table and the final
int8 / fp32 ratio, and writes the three curves in one plot in report.html and accuracy.json.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

from torch_report import write_html  # beside this script
from tierflow.torch import OffloadAdamW, offload_parameters

CORPUS = "/usr/share/common-licenses"
STATE_DTYPES = ("fp32", "bf16", "int8")


class Decoder(nn.Module):
    """Byte embedding + learned positions, pre-LN causal transformer blocks, a head."""

    def __init__(self, layers, width, context, vocab=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, max(1, width // 32), 4 * width, dropout=0.0,
                                       batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")),
                                                1))

    def forward(self, tokens):
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos.weight[:n]
        for layer in self.layers:
            x = layer(x, src_mask=self.mask[:n, :n])
        return self.head(self.norm(x))


def corpus(root=CORPUS):
    """Every regular file under root, in name order, as one byte tensor: 90 % to train on, the
    rest held out."""
    names = sorted(n for n in os.listdir(root)
                   if os.path.isfile(os.path.join(root, n))
                   and not os.path.islink(os.path.join(root, n)))
    if not names:
        raise SystemExit(f"torch_train_offload: no text under {root} (Debian's base-files)")
    data = b"".join(open(os.path.join(root, n), "rb").read() for n in names)
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    cut = int(len(tokens) * 0.9)
    return tokens[:cut], tokens[cut:], len(names)


def batch(text, rows, context, generator, device):
    starts = torch.randint(0, len(text) - context - 1, (rows,), generator=generator)
    chunk = torch.stack([text[s:s + context + 1] for s in starts.tolist()])
    return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


def held_out_loss(model, text, args, device):
    """The loss over a fixed held-out set: the same --eval-rows sequences at every call."""
    g = torch.Generator().manual_seed(7)
    total, rows = 0.0, args.eval_rows
    with torch.no_grad():
        x, y = batch(text, rows, args.context, g, device)
        if rows <= 64:
            return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
        for start in range(0, rows, 64):  # in pieces: the activations of 64 rows at a time
            part = slice(start, min(start + 64, rows))
            total += nn.functional.cross_entropy(model(x[part]).flatten(0, 1),
                                                 y[part].flatten(), reduction="sum").item()
        return total / y.numel()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def train(model, opt, data, args, device, handle=None, log=False):
    """Trains args.steps steps; returns the losses and, per step, its figures."""
    train_text, val_text = data
    g = torch.Generator().manual_seed(1)
    losses, steps = [], []
    for step in range(args.steps):
        x, y = batch(train_text, args.batch, args.context, g, device)
        sync(device)
        start = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        sync(device)
        passed = time.perf_counter()
        opt.step()
        sync(device)
        end = time.perf_counter()
        losses.append(loss.detach().clone())
        rec = {"step": step, "loss": loss.item(), "step_s": end - start,
               "optimizer_s": end - passed, "stall_s": 0.0, "compute_s": passed - start,
               "bytes_in": 0}
        if handle is not None:
            last = handle.metrics()["last_pass"]
            rec["stall_s"] = min(last["stall_s"], passed - start)
            rec["compute_s"] = passed - start - rec["stall_s"]
            rec["bytes_in"] = last["bytes_in"]
        if step % args.eval_every == 0 or step == args.steps - 1:
            rec["val_loss"] = held_out_loss(model, val_text, args, device)
        steps.append(rec)
        if log and "val_loss" in rec:
            print(f"step {step:4d}  loss {rec['loss']:.3f}  held-out {rec['val_loss']:.3f}  "
                  f"{rec['step_s'] * 1e3:6.0f} ms  stall {rec['stall_s'] * 1e3:5.1f} ms  "
                  f"streamed {rec['bytes_in'] / max(passed - start, 1e-9) / 1e9:.2f} GB/s",
                  flush=True)
    return torch.stack(losses), steps


def adam_tiers(where):
    """Bytes of Adam state per tier, from OffloadAdamW.where()."""
    out = {}
    for cls in ("master_params", "optimizer_state"):
        for node, pages in where[cls]["nodes"].items():
            tier = where["node_tiers"].get(node, f"node{node}")
            out[tier] = out.get(tier, 0) + pages * where["page_bytes"]
    return out


def summarize(m, adam, state_tiers, budget, steps, args):
    """The summary lines the C++ demo prints: loss, where the bytes lived, prefetch, link, Adam."""
    held = m["offloaded_bytes"] + adam["state_bytes"]
    h2d = m["links"]["h2d"]
    return [
        f"loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}, held-out "
        f"{steps[0]['val_loss']:.3f} -> {steps[-1]['val_loss']:.3f} in {args.steps} steps",
        "where the bytes lived: weights " + ", ".join(
            f"{b / 2**20:.1f} MiB in {t}" for t, b in m["tiers"].items())
        + "; Adam state " + ", ".join(f"{b / 2**20:.1f} MiB in {t}"
                                      for t, b in state_tiers.items())
        + f" ({adam['mode']} mode); HBM staging peak {m['hbm_staging_peak_bytes'] / 2**20:.2f}"
        f" MiB of {budget / 2**20:.2f}: weights + state = {held / budget:.1f} x the budget",
        f"prefetch: window {m['window']}, stall {100 * m['stall_fraction']:.1f} % of the "
        f"passes' time, overlap efficiency {m['overlap_efficiency']:.2f}, "
        f"{m['bytes_in'] / 2**20:.0f} MiB streamed in",
        f"link: {h2d['achieved_gbps']:.1f} GB/s achieved while busy, bound "
        f"{m['bound_gbps']['h2d']:.1f} GB/s (host to device)",
        f"Adam: {adam['mode']} mode, {adam['kernel']} kernel, {adam['threads']} threads, "
        f"{1e3 * adam['step_seconds_total'] / max(adam['steps'], 1):.1f} ms a step, "
        f"{args.state_dtype} moments: {adam['state_bytes'] / max(adam['params'], 1):.2f} B of "
        "state per param",
        f"overlap {args.overlap}: step() after the backward pass (exposed) "
        f"{1e3 * statistics.median(r['optimizer_s'] for r in steps[1:] or steps):.1f} ms "
        f"(median), {adam['speculative_steps']} speculative steps, {adam['rollbacks']} rollbacks",
    ]


def hbm_mark(device):
    """What torch's allocator holds on the GPU now (0 on the CPU); its peak counts from here."""
    if device != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def hbm_peak_above(device, base):
    """torch's allocator peak on the GPU since hbm_mark, above its base (None on the CPU)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--context", type=int, default=32, help="tokens (bytes) per sequence")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=None, help="default 60 (--accuracy: 300)")
    p.add_argument("--eval-every", type=int, default=None, help="default 10 (--accuracy: 20)")
    p.add_argument("--eval-rows", type=int, default=None,
                   help="held-out sequences per evaluation (default 4 x --batch; --accuracy: 256)")
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--overlap", choices=("auto", "none", "backward", "backward_publish"),
                   default="auto",
                   help="backward: each param's Adam update starts as soon as its grad is final "
                   "(OffloadAdamW(overlap=...)); auto (default): backward_publish on a GPU (it "
                   "frees the offloaded weights' grads early), none on the CPU")
    p.add_argument("--state-dtype", choices=STATE_DTYPES, default=None,
                   help="how the Adam moments are stored: fp32 (default), bf16 or int8 "
                   "(OffloadAdamW(state_dtype=...), cpu mode)")
    p.add_argument("--accuracy", action="store_true",
                   help="train the same model once per state dtype (fp32, bf16, int8) and "
                   "compare their held-out loss curves")
    p.add_argument("--verify", action="store_true")
    p.add_argument("--out", default="tierflow-torch")
    args = p.parse_args()
    if args.accuracy and args.verify:
        p.error("--accuracy and --verify are separate runs")
    if args.accuracy and args.state_dtype is not None:
        p.error("--accuracy trains with every --state-dtype: give one or the other")
    args.state_dtype = args.state_dtype or "fp32"
    if args.steps is None:
        args.steps = 300 if args.accuracy else 60
    if args.eval_every is None:
        args.eval_every = 20 if args.accuracy else 10
    if args.eval_rows is None:
        args.eval_rows = 256 if args.accuracy else 4 * args.batch
    for name in ("layers", "width", "context", "batch", "steps", "eval_every", "eval_rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, not {getattr(args, name)}")
    if args.window < 0:
        p.error(f"--window must be >= 0, not {args.window}")
    if not 0 < args.lr < float("inf"):
        p.error(f"--lr must be finite and > 0, not {args.lr}")
    try:
        os.makedirs(args.out, exist_ok=True)
        probe = os.path.join(args.out, ".write-test")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:  # found before training, not after
        p.error(f"--out {args.out}: cannot write there: {e.strerror}")
    return args


def accuracy(args, device, data, files):
    """--accuracy: the same model, seed and data trained once per state dtype; the held-out
    curves as a table, in report.html (one plot) and in accuracy.json."""
    print(f"tierflow torch accuracy: a {args.layers}-block decoder, width {args.width}, on "
          f"{device}, {args.steps} steps per state dtype ({', '.join(STATE_DTYPES)}), held-out "
          f"loss every {args.eval_every} steps over {args.eval_rows} sequences of "
          f"{args.context} bytes ({files} files)", flush=True)
    curves, runs = {}, {}
    for dtype in STATE_DTYPES:
        torch.manual_seed(0)  # the same initial weights for each
        model = Decoder(args.layers, args.width, args.context).to(device)
        opt = OffloadAdamW(model.parameters(), lr=args.lr, weight_decay=0.01, max_grad_norm=1.0,
                           overlap=args.overlap, state_dtype=dtype)
        start = time.perf_counter()
        _, steps = train(model, opt, data, args, device)
        seconds = time.perf_counter() - start
        adam = opt.metrics()["adam"]
        curves[dtype] = [(r["step"], r["val_loss"]) for r in steps if "val_loss" in r]
        runs[dtype] = {"state_bytes": adam["state_bytes"], "params": adam["params"],
                       "seconds": seconds, "steps": steps}
        print(f"{dtype}: held-out {curves[dtype][0][1]:.4f} -> {curves[dtype][-1][1]:.4f}, "
              f"{adam['state_bytes'] / adam['params']:.2f} B of state per param, "
              f"{seconds:.0f} s", flush=True)
    lines = ["step   " + "  ".join(f"{d:>7}" for d in STATE_DTYPES)
             + "   int8/fp32   bf16/fp32"]
    for k, (step, ref) in enumerate(curves["fp32"]):
        values = [curves[d][k][1] for d in STATE_DTYPES]
        lines.append(f"{step:5d}  " + "  ".join(f"{v:7.4f}" for v in values)
                     + f"   {values[2] / ref:9.4f}   {values[1] / ref:9.4f}")
    final = {d: curves[d][-1][1] for d in STATE_DTYPES}
    ratio = final["int8"] / final["fp32"]
    summary = [
        f"held-out loss after {args.steps} steps: "
        + ", ".join(f"{d} {final[d]:.4f}" for d in STATE_DTYPES),
        f"int8 / fp32 final held-out loss {ratio:.4f} ({100 * (ratio - 1):+.2f} %; goal within "
        f"1 %: {'met' if abs(ratio - 1) <= 0.01 else 'MISSED'}); bf16 / fp32 "
        f"{final['bf16'] / final['fp32']:.4f}",
        "Adam state per param: " + ", ".join(
            f"{d} {runs[d]['state_bytes'] / runs[d]['params']:.2f} B" for d in STATE_DTYPES),
    ]
    for line in lines + summary:
        print(line)
    steps = runs["fp32"]["steps"]
    for rec in steps:  # the tier chart: each state dtype's bytes of Adam state
        rec["tiers"] = {f"Adam state, {d}": runs[d]["state_bytes"] for d in STATE_DTYPES}
    with open(os.path.join(args.out, "accuracy.json"), "w") as f:
        json.dump({"args": vars(args), "curves": curves, "final": final,
                   "int8_over_fp32": ratio,
                   "runs": {d: {k: v for k, v in r.items() if k != "steps"}
                            for d, r in runs.items()}}, f, indent=1)
    write_html(os.path.join(args.out, "report.html"),
               f"tierflow: a {args.layers}-block decoder trained with fp32, bf16 and int8 Adam "
               "moments", summary, steps, curves=curves)
    print(f"files: {args.out}/report.html (the loss and time charts: the fp32 run), "
          f"{args.out}/accuracy.json")


def main():
    args = parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.overlap == "auto":
        args.overlap = "backward_publish" if device == "cuda" else "none"
    train_text, val_text, files = corpus()
    data = (train_text, val_text)
    if args.accuracy:
        accuracy(args, device, data, files)
        return
    model = Decoder(args.layers, args.width, args.context).to(device)
    plain = copy.deepcopy(model) if args.verify else None

    block = sum(q.numel() * q.element_size() for q in model.layers[0].parameters())
    budget = (args.window + 1) * (block + 64 * 1024)  # slots are aligned: some slack
    handle = offload_parameters(model, window=args.window, hbm_budget=budget, trace=True)
    opt = OffloadAdamW(model.parameters(), lr=args.lr, weight_decay=0.01, max_grad_norm=1.0,
                       overlap=args.overlap, state_dtype=args.state_dtype)
    weights = sum(q.numel() * q.element_size() for q in model.parameters())
    print(f"tierflow torch: a {args.layers}-block decoder, width {args.width}, on {device}, "
          f"learning {len(train_text) / 1e3:.0f} kB of Debian's licence texts ({files} files; "
          f"{len(val_text) / 1e3:.0f} kB held out); {weights / 2**20:.1f} MiB of weights, "
          f"HBM staging budget {budget / 2**20:.2f} MiB", flush=True)
    base = hbm_mark(device)
    losses, steps = train(model, opt, data, args, device, handle, log=True)
    hbm_peak = hbm_peak_above(device, base)

    m, adam, trace = handle.metrics(), opt.metrics()["adam"], handle.trace_json()
    state_tiers = adam_tiers(opt.where())
    for rec in steps:
        rec["tiers"] = {**{f"weights in {t}": b for t, b in m["tiers"].items()},
                        **{f"Adam state in {t}": b for t, b in state_tiers.items()},
                        "HBM staging peak": m["hbm_staging_peak_bytes"]}
    summary = summarize(m, adam, state_tiers, budget, steps, args)
    median_step = statistics.median(r["step_s"] for r in steps[1:] or steps)

    if args.verify:
        ref = OffloadAdamW(plain.parameters(), lr=args.lr, weight_decay=0.01,
                           max_grad_norm=1.0, mode="cpu", state_dtype=args.state_dtype)
        base = hbm_mark(device)
        ref_losses, ref_steps = train(plain, ref, data, args, device)
        if hbm_peak is not None:
            resident_weights = sum(q.numel() * q.element_size() for q in plain.parameters())
            summary.append(
                f"HBM during training (torch's allocator above what it held before: grads, "
                f"activations): offloaded {hbm_peak / 2**20:.0f} MiB + "
                f"{m['hbm_staging_peak_bytes'] / 2**20:.0f} MiB staging; resident "
                f"{hbm_peak_above(device, base) / 2**20:.0f} MiB + "
                f"{resident_weights / 2**20:.0f} MiB of weights")
        handle.remove()
        pairs = list(zip(model.parameters(), plain.parameters()))
        if device == "cpu":
            same = torch.equal(ref_losses, losses) and all(torch.equal(a, b) for a, b in pairs)
            kind = "bit-identical"
        else:
            same = all(torch.allclose(a, b, rtol=0, atol=1e-5 * b.abs().max().item())
                       for a, b in pairs)
            kind = "within 1e-5 of each weight's scale"
        resident = statistics.median(r["step_s"] for r in ref_steps[1:] or ref_steps)
        summary.append(f"offloaded step {median_step * 1e3:.0f} ms / resident step "
                       f"{resident * 1e3:.0f} ms = {median_step / resident:.2f} x (medians)")
        summary.append("verify: against the same training with nothing offloaded: "
                       + (kind if same else "DIFFERENT"))
    for line in summary:
        print(line)

    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump({"params": m, "adam": adam, "steps": steps}, f, indent=1)
    with open(os.path.join(args.out, "trace.json"), "w") as f:
        f.write(trace)
    write_html(os.path.join(args.out, "report.html"),
               f"tierflow: a {args.layers}-block decoder with streamed weights and offloaded "
               "Adam", summary, steps)
    print(f"files: {args.out}/report.html, {args.out}/metrics.json, {args.out}/trace.json")
    if args.verify and not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
