"""The model fetcher, run on the host that holds the model (`pvegpu-model-fetch.service`) in pvegpu's small
hub venv: the standard library and the pinned `huggingface_hub` only (an import-linter contract keeps it so),
uploaded as one file (`pvegpu.fetch.main`)."""
