"""ocria-tiny: its synthetic pages, training, evaluation and the studies behind its figures."""
