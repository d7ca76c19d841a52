"""Hugging Face Accelerate's ``examples/nlp_example.py`` (sentence-pair classification, GLUE MRPC style) with
only its imports changed: ``from accelerate import ...`` became ``from trainer.accelerate import ...``.

Nothing is downloaded: the model is a tiny transformer encoder built from a config dict (in place of
``AutoModelForSequenceClassification.from_pretrained``), the data synthetic sentence pairs (labelled by the
first sentence's topic), the metric computed by hand (in place of ``evaluate``).

    python examples/accelerate_nlp.py --cpu                          # one process
    python -m trainer run --devices 2 examples/accelerate_nlp.py --cpu   # two processes (accelerate launch)
    python -m trainer run --config accelerate_config.yaml examples/accelerate_nlp.py   # `accelerate config`'s file
"""
import argparse
import math
from types import SimpleNamespace

import torch
from torch import nn
from torch.optim import AdamW
from torch.utils.data import DataLoader

from trainer.accelerate import Accelerator, DistributedType
from trainer.accelerate.utils import set_seed

MAX_GPU_BATCH_SIZE = 16
EVAL_BATCH_SIZE = 32
MODEL_CONFIG = {"vocab_size": 64, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position": 64,
                "dropout": 0.1, "num_labels": 2, "pad_token_id": 0}  # fmt: skip


class TinyEncoderForSequenceClassification(nn.Module):
    """A BERT-shaped classifier from a config dict: embeddings, transformer encoder layers, a head on the mean
    of the tokens."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        hidden = config["hidden_size"]
        self.embeddings = nn.Embedding(config["vocab_size"], hidden, padding_idx=config["pad_token_id"])
        self.positions = nn.Embedding(config["max_position"], hidden)
        layer = nn.TransformerEncoderLayer(hidden, config["num_heads"], 4 * hidden, config["dropout"], batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, config["num_layers"], enable_nested_tensor=False)
        self.classifier = nn.Linear(hidden, config["num_labels"])

    def forward(self, input_ids, attention_mask, labels=None):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = self.embeddings(input_ids) + self.positions(positions)
        hidden = self.encoder(hidden, src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        logits = self.classifier((hidden * mask).sum(1) / mask.sum(1))  # mean over the tokens
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SimpleNamespace(loss=loss, logits=logits)


def synthetic_pairs(count: int, seed: int) -> list[dict]:
    """Sentence pairs as token ids, ``[CLS] a [SEP] b [SEP]``, each sentence drawn from one of 4 topics (a range
    of the vocabulary); the label says whether the first sentence is on topic 0 or 1."""
    generator = torch.Generator().manual_seed(seed)
    topic_size = (MODEL_CONFIG["vocab_size"] - 4) // 4

    def sentence(topic: int) -> list[int]:
        length = int(torch.randint(5, 15, (1,), generator=generator))
        return (4 + topic * topic_size + torch.randint(0, topic_size, (length,), generator=generator)).tolist()

    examples = []
    for _ in range(count):
        first_topic, second_topic = torch.randint(0, 4, (2,), generator=generator).tolist()
        ids = [1] + sentence(first_topic) + [2] + sentence(second_topic) + [2]
        examples.append({"input_ids": ids, "labels": int(first_topic < 2)})
    return examples


def get_dataloaders(accelerator: Accelerator, batch_size: int = 16):
    """The train and validation DataLoaders of the synthetic pairs."""
    with accelerator.main_process_first():
        datasets = {"train": synthetic_pairs(512, seed=0), "validation": synthetic_pairs(100, seed=1)}

    def collate_fn(examples):
        # For Torchxla, it's best to pad everything to the same length or training will be very slow.
        max_length = 128 if accelerator.distributed_type == DistributedType.XLA else None
        # When using mixed precision we want round multiples of 8/16
        if accelerator.mixed_precision == "fp8":
            pad_to_multiple_of = 16
        elif accelerator.mixed_precision != "no":
            pad_to_multiple_of = 8
        else:
            pad_to_multiple_of = None
        length = max_length or max(len(example["input_ids"]) for example in examples)
        if pad_to_multiple_of:
            length = math.ceil(length / pad_to_multiple_of) * pad_to_multiple_of
        input_ids = torch.zeros(len(examples), length, dtype=torch.long)
        for row, example in enumerate(examples):
            input_ids[row, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
        return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(),
                "labels": torch.tensor([example["labels"] for example in examples])}  # fmt: skip

    train_dataloader = DataLoader(
        datasets["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size, drop_last=True
    )
    eval_dataloader = DataLoader(
        datasets["validation"],
        shuffle=False,
        collate_fn=collate_fn,
        batch_size=EVAL_BATCH_SIZE,
        drop_last=(accelerator.mixed_precision == "fp8"),
    )
    return train_dataloader, eval_dataloader


def compute_metric(predictions: torch.Tensor, references: torch.Tensor) -> dict:
    """GLUE MRPC's metric: accuracy and F1 of the positive class (and how many samples it counted)."""
    true_positive = int(((predictions == 1) & (references == 1)).sum())
    precision = true_positive / max(1, int((predictions == 1).sum()))
    recall = true_positive / max(1, int((references == 1).sum()))
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"accuracy": float((predictions == references).float().mean()), "f1": f1, "samples": len(references)}


def training_function(config, args):
    # Initialize accelerator
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    seed = int(config["seed"])
    batch_size = int(config["batch_size"])

    # If the batch size is too big we use gradient accumulation
    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    # Instantiate the model (we build the model here so that the seed also controls new weights initialization)
    model = TinyEncoderForSequenceClassification(MODEL_CONFIG)
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    # get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=...)
    num_training_steps = (len(train_dataloader) * num_epochs) // gradient_accumulation_steps
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(step / 10, max(0.0, (num_training_steps - step) / (num_training_steps - 10)))
    )

    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            loss = loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

        model.eval()
        all_predictions, all_references = [], []
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            all_predictions.append(predictions)
            all_references.append(references)

        eval_metric = compute_metric(torch.cat(all_predictions), torch.cat(all_references))
        # Use accelerator.print to print only on the main process.
        accelerator.print(f"epoch {epoch}:", eval_metric)
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument(
        "--mixed_precision",
        type=str,
        default=None,
        choices=["no", "fp16", "bf16", "fp8"],
        help="Whether to use mixed precision. Choose between fp16 and bf16 (bfloat16).",
    )
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 2e-3, "num_epochs": 3, "seed": 42, "batch_size": 16}
    training_function(config, args)


if __name__ == "__main__":
    main()
