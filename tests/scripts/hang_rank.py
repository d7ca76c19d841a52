"""Two DDP ranks started by the Trainer (``python hang_rank.py READY``); rank 1 stops itself (SIGSTOP) after
global step 5, after writing its pid to READY. Rank 0's next collective times out after ``train_timeout``
(5 s): the job must end with an error naming rank 1 and the step."""
import os
import signal
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for helpers
from helpers import Regressor, regression_data  # noqa: E402

from trainer.strategies import DDPStrategy  # noqa: E402
from trainer import Trainer  # noqa: E402


class StopsAtStep5(Regressor):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_rank == 1 and self.global_step == 5:
            Path(sys.argv[1]).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    torch.set_num_threads(1)
    data = DataLoader(regression_data(n=4000), batch_size=4)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(train_timeout=5), max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(StopsAtStep5(), data)
