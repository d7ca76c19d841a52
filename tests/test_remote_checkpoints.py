"""Checkpoints at fsspec URLs: ``memory://`` (fsspec's in-process file system) and a real S3 API on 127.0.0.1
(moto's server, reached through s3fs). Files and sharded folders, written under a temporary name and committed
last, found by ``ckpt_path="last"``/``"auto"`` and checked before they load. Needs ``pip install '.[s3]'``."""
from __future__ import annotations

import socket

import pytest
import torch
from ckpt_support import TinyRegressor, loaders, make_trainer, same_weights, uninterrupted

from trainer.callbacks import ModelCheckpoint
from trainer.strategies import Strategy
from trainer.strategies.checkpoint.checkpoint_io import CheckpointError

fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed (optional: pip install '.[s3]')")


def _names(fs, folder: str) -> list[str]:
    return sorted(path.rsplit("/", 1)[-1] for path in fs.ls(folder, detail=False))


def _fit_resume_and_fall_back(root: str, fs, tmp_path) -> None:
    """Train 2 epochs saving to ``root``, resume to 3 epochs from "last"; damage the newest, "auto" falls back."""
    train, val = loaders()
    reference = uninterrupted(tmp_path / "ref", max_epochs=3)

    torch.manual_seed(0)
    folder = f"{root}/checkpoints"
    callback = ModelCheckpoint(every_n_train_steps=2, save_last=True, keep_last_n=2)
    make_trainer(root, max_epochs=2, callbacks=[callback]).fit(TinyRegressor(), train, val)  # dirpath from the root
    inner = fs._strip_protocol(folder)
    assert _names(fs, inner) == ["epoch=1-step=6.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]  # no temporaries left

    resumed = TinyRegressor()
    none_written = ModelCheckpoint(save_top_k=0)
    trainer = make_trainer(root, max_epochs=3, callbacks=[none_written])
    trainer.fit(resumed, train, val, ckpt_path="last")
    assert trainer.ckpt_path == f"{folder}/last.ckpt" and same_weights(reference, resumed)

    for name in ("last.ckpt", "epoch=1-step=8.ckpt"):  # an upload that broke off (a copy, not a link, remotely)
        data = fs.cat_file(f"{inner}/{name}")
        fs.pipe_file(f"{inner}/{name}", data[: len(data) // 2])
    again = make_trainer(root, max_epochs=3, callbacks=[ModelCheckpoint(save_top_k=0)])
    with pytest.warns(UserWarning, match="Skipping a damaged checkpoint"):
        again.fit(TinyRegressor(), train, val, ckpt_path="auto")
    assert again.ckpt_path == f"{folder}/epoch=1-step=6.ckpt"


def _sharded_round_trip(root: str, fs, capsys) -> None:
    """A sharded folder at a URL: manifest last, loads whole, consolidates with the command; no manifest: refused."""
    from trainer.strategies.checkpoint.sharded_checkpoint import load_full, save_sharded
    from trainer.cli import main

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    checkpoint = {"state_dict": model.state_dict(), "global_step": 7,
                  "optimizer_states": [{"state": {"weight": optimizer.state_dict()["state"][0]},
                                        "param_groups": [{"lr": 0.1, "params": ["weight"]}]}]}  # fmt: skip
    folder = f"{root}/sharded.ckpt"
    save_sharded(Strategy(), checkpoint, folder)
    assert "manifest.json" in _names(fs, fs._strip_protocol(folder))
    loaded = load_full(folder)
    assert torch.equal(loaded["state_dict"]["weight"], model.weight) and loaded["global_step"] == 7
    assert main(["checkpoint", "consolidate", folder, f"{root}/full.ckpt"]) == 0
    assert "step 7" in capsys.readouterr().out
    with fs.open(fs._strip_protocol(f"{root}/full.ckpt"), "rb") as f:
        assert torch.equal(torch.load(f, weights_only=True)["state_dict"]["bias"], model.bias)
    fs.rm(fs._strip_protocol(f"{folder}/manifest.json"))  # as if the upload stopped before its last object
    with pytest.raises(CheckpointError, match="has no manifest.json: its upload did not finish"):
        load_full(folder)


def test_memory_urls_hold_resumable_checkpoints(tmp_path, capsys) -> None:
    fs = fsspec.filesystem("memory")
    root = f"memory://{tmp_path.name}"
    try:
        _fit_resume_and_fall_back(root, fs, tmp_path)
        _sharded_round_trip(root, fs, capsys)
    finally:
        fs.rm(f"/{tmp_path.name}", recursive=True)


@pytest.fixture
def s3_bucket(monkeypatch):
    """A bucket on moto's S3 server at 127.0.0.1 (started and stopped here), reached through s3fs."""
    s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed (optional: pip install '.[s3]')")
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed (optional: pip install '.[s3]')")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                           AWS_ENDPOINT_URL=endpoint, FSSPEC_S3_ENDPOINT_URL=endpoint).items():  # fmt: skip
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    fs.mkdir("trainer-test")
    try:
        yield fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


@pytest.mark.timeout(180)
def test_s3_holds_resumable_checkpoints(s3_bucket, tmp_path, capsys) -> None:
    _fit_resume_and_fall_back("s3://trainer-test/run", s3_bucket, tmp_path)
    _sharded_round_trip("s3://trainer-test/run", s3_bucket, capsys)
