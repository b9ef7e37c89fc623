"""hdk inside other libraries' models: ``hdk.integrations.transformers.enable(model)`` runs a
Hugging Face transformers model's decode on hdk's kernels (docs/integrations.md)."""
