#!/usr/bin/env python3
"""Example FSDP2 trainer in Python: an HF transformers model wrapped by `fully_shard`, trained
with AdamW, pushing its weights to inference ranks after every optimizer step.

    torchrun --nproc-per-node N trainer.py --config MODEL_DIR_OR_CONFIG_JSON \\
        --coordinator HOST:PORT --receivers R [--steps K]

Trainer rank 0 hosts wsync's coordinator on HOST:PORT; R receivers (examples/python/receiver.py
or examples/c/worker.c without its check, or wsync-engine) connect to it. Each rank hands wsync
its FSDP2 state dict as it is: DTensors sharded along dim 0 over the mesh; wsync reads each
rank's local shard in place at every push, so after the optimizer step the new weights go out
with no gather and no copy on the trainer.

Needs PyTorch (2.6 or later, for torch.distributed.fsdp.fully_shard), transformers, the wsync
package (PYTHONPATH=<checkout>/python or pip install ./python) and libwsync.so
(WSYNC_LIBRARY). It does not run in wsync's CI, which has no PyTorch: there it only has to be
valid Python, and without PyTorch it exits at once saying what is missing. On GPUs each rank
uses cuda:LOCAL_RANK (NCCL for training; wsync picks its scheme itself); without GPUs it runs on
the CPU over gloo. The batch is random tokens: replace it with yours."""
import argparse
import os
import sys

try:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
except ImportError as e:
    sys.exit(f"trainer.py needs PyTorch 2.6+ with torch.distributed.fsdp.fully_shard ({e}); "
             "this example cannot run without it (examples/c/trainer.c needs no PyTorch)")
try:
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as e:
    sys.exit(f"trainer.py needs transformers ({e})")
import wsync


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="HF model directory or its config.json")
    ap.add_argument("--coordinator", default="127.0.0.1:29600")
    ap.add_argument("--receivers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    # torchrun sets RANK, WORLD_SIZE and LOCAL_RANK
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    # The model in bf16, every decoder layer sharded, then the root (FSDP2's usual pattern).
    path = args.config
    hf_config = AutoConfig.from_pretrained(os.path.dirname(path) if path.endswith(".json") else path)
    torch.manual_seed(0)   # every rank builds the same initial weights
    model = AutoModelForCausalLM.from_config(hf_config).to(device=device, dtype=torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    with wsync.Sender(args.coordinator, rank=rank, world=world, receivers=args.receivers) as sender:
        # The state dict's values are the DTensors the optimizer updates in place: wsync takes
        # each rank's local shard and its rows from the placement (Shard(0)), no layout needed.
        # A tied lm_head (tie_word_embeddings) is the same tensor as embed_tokens: drop it, as
        # the checkpoint does.
        state = model.state_dict()
        if getattr(hf_config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        sender.add_state_dict(state)
        if rank == 0:
            print(f"trainer: coordinator on {sender.coordinator}, {len(state)} params", flush=True)

        for step in range(1, args.steps + 1):
            tokens = torch.randint(0, hf_config.vocab_size, (2, 32), device=device)
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if cuda:
                torch.cuda.synchronize()   # the step's kernels must be done before wsync reads
            sender.push(step)              # returns once every receiver committed this step
            if rank == 0:
                print(f"trainer: step {step}, loss {loss.item():.4f}, pushed", flush=True)

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
