"""A ``run_clm_no_trainer.py``-style script (transformers' causal-LM example for Accelerate) on the Engine: the one
change is the import, ``from accelerate import Accelerator`` -> ``from trainer.accelerate import Accelerator``.

Nothing is downloaded: the model is built from a tiny GPT-2 config (``AutoModelForCausalLM.from_config``, the
script's ``--config_name`` road), the corpus is token ids made here (in place of a tokenised ``load_dataset``),
grouped into blocks as the original's ``group_texts`` does.

    python examples/hf/run_clm.py --output_dir out                               # one process
    python -m trainer run --devices 2 examples/hf/run_clm.py --output_dir out     # two (accelerate launch)

The folder ``out`` then loads with ``AutoModelForCausalLM.from_pretrained("out")``.
"""
import argparse
import math

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, GPT2Config, default_data_collator, get_scheduler

from trainer.accelerate import Accelerator
from trainer.accelerate.utils import set_seed

VOCAB = 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a causal language model (run_clm_no_trainer, tiny).")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--weight_decay", type=float, default=0.0)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--lr_scheduler_type", default="linear")
    parser.add_argument("--num_warmup_steps", type=int, default=2)
    parser.add_argument("--block_size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpointing_steps", default="epoch")
    return parser.parse_args()


def corpus(documents: int = 96, seed: int = 1) -> datasets.Dataset:
    """Tokenised documents: short runs of counting sequences (learnable), as a tokenizer's ``map`` would give."""
    generator = torch.Generator().manual_seed(seed)

    def rows():
        for _ in range(documents):
            start, length = torch.randint(0, VOCAB, (2,), generator=generator).tolist()
            yield {"input_ids": [(start + i) % VOCAB for i in range(8 + length % 24)]}

    return datasets.Dataset.from_generator(rows)


def group_texts(examples: dict, block_size: int) -> dict:
    """The original's ``group_texts``: concatenate, cut into ``block_size`` blocks, labels = inputs."""
    concatenated = sum(examples["input_ids"], [])
    total = (len(concatenated) // block_size) * block_size
    blocks = [concatenated[i: i + block_size] for i in range(0, total, block_size)]
    return {"input_ids": blocks, "labels": [list(b) for b in blocks]}


def build_model() -> torch.nn.Module:
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                        eos_token_id=0)  # fmt: skip
    return AutoModelForCausalLM.from_config(config)


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(args.seed)

    raw = corpus().train_test_split(test_size=0.125, seed=args.seed)
    with accelerator.main_process_first():
        lm_datasets = raw.map(lambda e: group_texts(e, args.block_size), batched=True,
                              remove_columns=["input_ids"])  # fmt: skip
    train_dataset, eval_dataset = lm_datasets["train"], lm_datasets["test"]
    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=default_data_collator,
                                  batch_size=args.per_device_train_batch_size)  # fmt: skip
    eval_dataloader = DataLoader(eval_dataset, collate_fn=default_data_collator,
                                 batch_size=args.per_device_eval_batch_size)  # fmt: skip

    model = build_model()
    no_decay = ["bias", "layer_norm.weight", "ln_"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]  # fmt: skip
    optimizer = torch.optim.AdamW(grouped, lr=args.learning_rate)

    updates_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * updates_per_epoch
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=max_train_steps * accelerator.num_processes)  # fmt: skip
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        model.train()
        for batch in train_dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                accelerator.print(f"step {completed_steps}: loss {loss.item()!r}")  # repr: exact, to compare runs

        model.eval()
        losses = []
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            losses.append(accelerator.gather_for_metrics(outputs.loss.repeat(args.per_device_eval_batch_size)))
        eval_loss = torch.mean(torch.cat(losses))
        perplexity = math.exp(eval_loss) if eval_loss < 20 else float("inf")
        accelerator.print(f"epoch {epoch}: perplexity: {perplexity:.4f} eval_loss: {eval_loss:.6f}")
        if args.checkpointing_steps == "epoch":
            accelerator.save_state(f"{args.output_dir}/epoch_{epoch}")

    accelerator.wait_for_everyone()
    unwrapped_model = accelerator.unwrap_model(model)
    unwrapped_model.save_pretrained(args.output_dir, is_main_process=accelerator.is_main_process,
                                    save_function=accelerator.save)  # fmt: skip


if __name__ == "__main__":
    main()
