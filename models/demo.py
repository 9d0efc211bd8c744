"""The main job: train an MLP on the generated digits and report loss,
held-out accuracy and samples/s.

    python -m pyflow.models.demo [--epochs 3] [--batch-size 128] [--train 20000]
"""
import argparse
import sys
import time

import pyflow
from pyflow import nn
from pyflow.utils.data import DataLoader, TensorDataset

from .digits import make_digits
from .mlp import MLP


def evaluate(model, images, labels, batch_size=1000):
    model.eval()
    correct, loss_sum = 0, 0.0
    with pyflow.no_grad():
        for i in range(0, len(labels), batch_size):
            x, y = images[i:i + batch_size], labels[i:i + batch_size]
            logits = model(x)
            loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
    model.train()
    return loss_sum / len(labels), correct / len(labels)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--train", type=int, default=20000, help="number of training images")
    p.add_argument("--test", type=int, default=4000, help="number of held-out images")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.train < args.batch_size or args.test < 1:
        p.error("--epochs, --batch-size and --test must be >= 1, --train >= --batch-size")

    pyflow.manual_seed(args.seed)
    xtr, ytr = make_digits(args.train, seed=args.seed)
    xte, yte = make_digits(args.test, seed=args.seed + 1)
    train = DataLoader(TensorDataset(pyflow.from_numpy(xtr), pyflow.from_numpy(ytr)),
                       batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = MLP()
    opt = pyflow.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = pyflow.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr,
                                                 total_steps=args.epochs * len(train))
    print(f"pyflow {pyflow.__version__}: MLP {sum(p.numel() for p in model.parameters()):,} "
          f"parameters, {args.train} generated training digits, {args.test} held out")
    xte_t, yte_t = pyflow.from_numpy(xte), pyflow.from_numpy(yte)
    for epoch in range(1, args.epochs + 1):
        seen, loss_sum, t0 = 0, 0.0, time.perf_counter()
        for x, y in train:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
        dt = time.perf_counter() - t0
        test_loss, acc = evaluate(model, xte_t, yte_t)
        print(f"epoch {epoch}: train loss {loss_sum / seen:.4f}  test loss {test_loss:.4f}  "
              f"test accuracy {acc:.2%}  {seen / dt:,.0f} samples/s")
    return acc


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
