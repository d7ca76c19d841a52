"""``trainer run`` launching real training: two processes with a config file, and two nodes on localhost.

Every launch must end with the weights of the reference run (launching.reference: 2 processes, torchrun).
"""
from __future__ import annotations

import socket

from launching import STEPS, TRAIN, assert_same_weights, finish, load_weights, reference, run, start, trainer_command


def test_run_two_processes_from_a_config_file(tmp_path):
    """devices and max_steps come from the file: the script's plain Trainer() joins a 2-process torchrun job."""
    (tmp_path / "exp.yaml").write_text(f"devices: 2\nenv: {{OMP_NUM_THREADS: '1'}}\ntrainer: {{max_steps: {STEPS}}}\n")
    run(trainer_command("run", "--config", "exp.yaml", str(TRAIN), str(tmp_path)), cwd=tmp_path)
    assert_same_weights(load_weights(tmp_path / "weights-0.pt"), reference())


def test_run_two_nodes_on_localhost(tmp_path):
    """Two `trainer run --num-nodes 2 --node-rank 0/1` (static rendezvous) form one job of two processes."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    common = ["run", "--num-nodes", "2", "--main-address", "127.0.0.1", "--main-port", port,
              "--trainer.max_steps", str(STEPS)]  # fmt: skip
    outs = [tmp_path / "node0", tmp_path / "node1"]
    nodes = [start(trainer_command(*common, "--node-rank", str(rank), str(TRAIN), str(out))) for rank, out in enumerate(outs)]
    for node in nodes:
        finish(node)
    assert_same_weights(load_weights(outs[0] / "weights-0.pt"), reference())
