"""What a Trainer checkpoint holds and how a run is restored from one: its contents and the resume order, the
exact position inside an epoch, finding the newest good checkpoint (``"last"``, ``"best"``) and the
``ckpt_path="auto"`` policy of restarted jobs. Writing and reading files safely is
``trainer.strategies.checkpoint``'s."""
