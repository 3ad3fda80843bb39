"""Train a small PyTorch model with tierflow's OffloadAdamW: torch.optim.AdamW's update, with the
fp32 master weights and Adam moments held in tierflow's memory tiers.

    PYTHONPATH=build/dev/python /usr/bin/python3 examples/torch_offload.py

Runs on the GPU when torch sees one, else on the CPU (tierflow's emulated device).
"""
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(
        nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True),
        nn.Flatten(), nn.Linear(8 * 64, 10),
    ).to(device)

    # The one line that changes from torch.optim.AdamW:
    opt = OffloadAdamW(model.parameters(), lr=3e-3, weight_decay=0.01, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=60)

    x = torch.randn(256, 8, 64, device=device)
    y = torch.randint(0, 10, (256,), device=device)
    for step in range(60):
        batch = torch.randint(0, 256, (32,), device=device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        opt.step()
        sched.step()
        if step % 10 == 0 or step == 59:
            print(f"step {step:2d}  loss {loss.item():.4f}  grad norm {opt.last_grad_norm:.3f}"
                  f"  lr {sched.get_last_lr()[0]:.2e}")

    adam = opt.metrics()["adam"]
    print(f"tierflow: mode {adam['mode']} ({adam['mode_reason']}); {adam['steps']} steps, "
          f"{adam['state_bytes'] / 2**20:.1f} MiB of state, last step "
          f"{adam['last_step_seconds'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
