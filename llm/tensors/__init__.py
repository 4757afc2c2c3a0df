"""The tensors of one step and the passes that compute them: batches, chunked log-probabilities under the token
filter, the loss per importance-sampling mode, the diagnostics of Theorem 1's terms, and the metric names."""
