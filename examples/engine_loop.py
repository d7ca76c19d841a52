"""The digits example (examples/digits.py: scikit-learn's 8x8 digits, no download) as a hand-written loop
with the Engine: the same model and data, your own loop, the Trainer's strategies underneath.

    python examples/engine_loop.py                                  # one process (on a GPU if there is one)
    python examples/engine_loop.py --accelerator cpu --devices 2    # two processes: the Engine starts the second
    python -m trainer run --devices 2 examples/engine_loop.py       # two processes started by torchrun
    python examples/engine_loop.py --precision bf16-mixed --accumulate 2
"""
from __future__ import annotations

import argparse
import math

import torch
from torch.nn import functional as F

from digits import DigitsClassifier, DigitsData
from trainer import Engine, seed_everything


def evaluate(engine: Engine, model: torch.nn.Module, loader) -> float:
    """Accuracy over the whole validation set: each rank counts its share, the counts are summed."""
    model.eval()
    correct = torch.zeros(2, device=engine.device)
    with torch.no_grad():
        for x, y in loader:
            correct += torch.stack([(model(x).argmax(dim=1) == y).sum(), torch.tensor(len(y), device=engine.device)])
    model.train()
    right, total = engine.reduce(correct, "sum").tolist()
    return right / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Left out, these come from the launcher (`trainer run`) or the Engine's defaults.
    parser.add_argument("--devices", type=int)
    parser.add_argument("--accelerator")
    parser.add_argument("--precision")
    parser.add_argument("--accumulate", type=int, dest="accumulate_grad_batches")
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--root-dir", default="runs/engine_loop")
    args = parser.parse_args()

    seed_everything(42)
    torch.set_num_threads(1)
    given = {key: getattr(args, key) for key in ("devices", "accelerator", "precision", "accumulate_grad_batches")}
    engine = Engine(**{k: v for k, v in given.items() if v is not None}, loggers="csv", project_dir=args.root_dir)
    data = DigitsData(args.batch_size)
    data.setup("fit")
    classifier = DigitsClassifier()
    optimizer = torch.optim.AdamW(classifier.parameters(), lr=classifier.hparams.lr)
    model, optimizer, train_loader = engine.prepare(classifier, optimizer, data.train_dataloader())
    val_loader = engine.prepare_data_loader(data.val_dataloader(), evaluation=True)
    steps = args.max_epochs * math.ceil(len(train_loader) / engine.gradient_accumulation_steps)  # the whole run
    scheduler = engine.prepare(torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps))
    engine.init_trackers("digits", {**classifier.hparams, **vars(args)})

    step = 0
    for epoch in range(args.max_epochs):
        for x, y in train_loader:
            with engine.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                engine.backward(loss)
                engine.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if engine.sync_gradients:
                step += 1
                if step % 10 == 0:
                    engine.log({"train_loss": loss.detach()}, step=step)
        accuracy = evaluate(engine, model, val_loader)
        engine.log({"val_acc": accuracy, "epoch": epoch}, step=step)
    engine.print(f"final validation accuracy: {accuracy:.4f}")
    engine.end_training()


if __name__ == "__main__":
    main()
