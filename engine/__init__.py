"""OCRia engine: page images + prompt in, text out. Knows nothing of Ray or object storage."""
