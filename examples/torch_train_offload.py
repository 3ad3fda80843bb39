"""The main job in PyTorch: a transformer trains with its weights in a host tier, streamed into
HBM block by block ahead of compute (offload_parameters), and its Adam state offloaded
(OffloadAdamW), while weights + Adam state are many times the HBM staging budget.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/torch_train_offload.py --verify

Runs on the GPU when torch sees one, else on the CPU (tierflow's emulated device, whose link
model caps the rate). --verify trains the same model without any offload and checks that every
loss and every weight is bit-identical. Writes metrics.json and trace.json (Perfetto) to --out.
"""
import argparse
import copy
import json
import os
import time

import torch
from torch import nn

from tierflow.torch import OffloadAdamW, offload_parameters


class Model(nn.Module):
    def __init__(self, layers, width, vocab=512):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.out = nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def batches(steps, batch, tokens, vocab, device):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        t = torch.randint(0, vocab, (batch, tokens + 1), generator=g)
        t[:, 1::2] = (t[:, 0::2][:, : t[:, 1::2].shape[1]] * 7 + 3) % vocab  # learnable pairs
        yield t[:, :-1].to(device), t[:, 1:].to(device)


def train(model, opt, args, device, log):
    losses = []
    for step, (x, y) in enumerate(batches(args.steps, args.batch, args.tokens, 512, device)):
        start = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        if log and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}  "
                  f"{(time.perf_counter() - start) * 1e3:.0f} ms")
    return torch.stack(losses)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--verify", action="store_true")
    p.add_argument("--out", default="tierflow-torch")
    args = p.parse_args()
    for name in ("layers", "width", "steps", "batch", "tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.window < 0:
        p.error("--window must be >= 0")
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Model(args.layers, args.width).to(device)
    plain = copy.deepcopy(model) if args.verify else None

    block = sum(q.numel() * q.element_size() for q in model.layers[0].parameters())
    budget = (args.window + 1) * (block + 64 * 1024)  # slots are aligned: some slack
    handle = offload_parameters(model, window=args.window, hbm_budget=budget, trace=True)
    opt = OffloadAdamW(model.parameters(), lr=3e-3, weight_decay=0.01, max_grad_norm=1.0)
    weights = sum(q.numel() * q.element_size() for q in model.parameters())
    print(f"tierflow torch: {args.layers} layers x {args.width} on {device}; "
          f"{weights / 2**20:.1f} MiB of weights, HBM staging budget {budget / 2**20:.1f} MiB")
    losses = train(model, opt, args, device, log=True)

    m, adam = handle.metrics(), opt.metrics()["adam"]
    held = m["offloaded_bytes"] + adam["state_bytes"]
    print(f"loss {losses[0].item():.4f} -> {losses[-1].item():.4f}")
    print(f"where the bytes lived: weights {m['offloaded_bytes'] / 2**20:.1f} MiB in a host "
          f"tier, Adam state {adam['state_bytes'] / 2**20:.1f} MiB ({adam['mode']} mode), "
          f"HBM staging peak {m['hbm_staging_peak_bytes'] / 2**20:.1f} MiB of "
          f"{budget / 2**20:.1f}: weights + state = {held / budget:.1f} x the budget")
    print(f"prefetch: window {m['window']}, stall {100 * m['stall_fraction']:.1f} %, "
          f"overlap efficiency {m['overlap_efficiency']:.2f}, "
          f"{m['bytes_in'] / 2**20:.0f} MiB streamed in")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump({"params": m, "adam": adam, "losses": losses.tolist()}, f, indent=1)
    with open(os.path.join(args.out, "trace.json"), "w") as f:
        f.write(handle.trace_json())
    print(f"files: {args.out}/metrics.json, {args.out}/trace.json")

    if args.verify:
        ref = OffloadAdamW(plain.parameters(), lr=3e-3, weight_decay=0.01, max_grad_norm=1.0,
                           mode="cpu")
        same = torch.equal(train(plain, ref, args, device, log=False), losses)
        handle.remove()
        same = same and all(torch.equal(a, b)
                            for a, b in zip(model.parameters(), plain.parameters()))
        print("verify: against the same training with no offload: "
              + ("bit-identical" if same else "DIFFERENT"))
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
