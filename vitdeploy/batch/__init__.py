"""Batch prediction on Ray Data (`vitdeploy batch-predict`): inputs, the job, its workers, the output."""
