"""``self.log``: where logged values are stored and reduced (on step, on epoch, across ranks), and where they
go from there (callback metrics, the progress bar, the loggers) and when. Reading them never communicates."""
