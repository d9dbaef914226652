"""The perplexity protocol: texts streamed through the model with each press holding the cache at a budget."""
