"""A small character-level transformer language model, trained elastically on a text it generates.

    elastic-ring train --script examples/char_lm.py --steps 400 --gpus 1 --resize-at 150 --to 2

The text (about 60,000 characters) comes from a seeded grammar of short English sentences, so the
example runs offline; a model that learns it well predicts most next characters. The test loss is
on sentences the training text does not hold (a different seed). Each training sample is a window
of the text; `job.sampler` keeps the position across resizes.
"""

import argparse
import math
import random

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

import elastic_ring.worker as elastic

WORDS = {"S": ["the cat", "a dog", "my friend", "the old man", "a small bird", "the teacher"],
         "V": ["sees", "likes", "finds", "follows", "draws", "helps"],
         "O": ["the red ball", "a green tree", "the river", "a quiet house", "the long road"],
         "E": ["today", "again", "at night", "in the morning", "with care"]}


def make_text(seed: int, sentences: int) -> str:
    r = random.Random(seed)
    return " ".join(f"{r.choice(WORDS['S'])} {r.choice(WORDS['V'])} {r.choice(WORDS['O'])} "
                    f"{r.choice(WORDS['E'])}." for _ in range(sentences))


class CharLM(nn.Module):
    def __init__(self, vocab: int, ctx: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.zeros(ctx, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
        self.body, self.head = nn.TransformerEncoder(layer, layers), nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        return self.head(self.body(self.tok(x) + self.pos[:t], mask=self.mask[:t, :t], is_causal=True))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ctx", type=int, default=48)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16, help="windows per worker and step")
    p.add_argument("--lr", type=float, default=1e-3, help="per worker (scaled by the world size)")
    a = p.parse_args()

    job = elastic.init()
    text, held_out = make_text(0, 2000), make_text(1, 100)
    chars = sorted(set(text + held_out))
    enc = {c: i for i, c in enumerate(chars)}
    data_ids = torch.tensor([enc[c] for c in text])
    test_ids = torch.tensor([enc[c] for c in held_out])

    torch.manual_seed(0)
    model = CharLM(len(chars), a.ctx, a.dim, layers=2, heads=4).to(job.device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr * job.size)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    data = job.sampler(len(data_ids) - a.ctx - 1, batch_size=a.batch_size, seed=0)

    def windows(ids: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([ids[s:s + a.ctx + 1] for s in starts.tolist()]).to(job.device)
        return rows[:, :-1], rows[:, 1:]

    def evaluate(step: int) -> dict:
        model.eval()
        with torch.no_grad():
            x, y = windows(test_ids, torch.arange(0, len(test_ids) - a.ctx - 1, a.ctx))
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, len(chars)), y.reshape(-1)).item()
            acc = (out.argmax(-1) == y).float().mean().item()
        model.train()
        return {"test_loss": loss, "test_accuracy": acc, "samples": y.numel()}

    job.register(model=model, optimizer=opt)
    job.on_evaluate(evaluate, every=100)
    job.restore()
    for step in job.steps():
        x, y = windows(data_ids, data.next_batch())
        loss = F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.record(loss, samples=len(x))
    if job.finished and job.rank == 0:
        r = evaluate(job.step)
        print(f"held-out loss {r['test_loss']:.3f} (uniform: {math.log(len(chars)):.3f}), "
              f"next-char accuracy {r['test_accuracy']:.3f}")


if __name__ == "__main__":
    main()
