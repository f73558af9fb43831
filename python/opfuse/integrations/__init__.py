"""opfuse where users already train: `opfuse.integrations.transformers.OpfuseCallback` for the
Hugging Face Trainer (a plain training loop calls `opfuse.tune` itself)."""
