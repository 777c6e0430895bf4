"""What judges artifacts and the machine they run on: ``validate`` (drift from eager PyTorch),
``bench`` (speed as ratios), ``info`` (what can run here).

    specs.py        which backends exist, the file and precision each runs, how to open one
    dataset.py      the validation images and their true labels
    drift.py        the drift run; drift_judge.py a backend's verdict (export/compare.py's metrics),
                    drift_report.py the report (drift-report.json), drift_table.py its table
    bench.py        latency and throughput per backend and batch size; timing.py: interleaved timers
    environment.py  `vitdeploy info`: libraries, providers, GPUs, which backends can run here

Imports only ``export`` (its comparator and library versions), ``runtime`` and the base modules.
"""
