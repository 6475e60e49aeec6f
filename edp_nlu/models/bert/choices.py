"""Values the BERT config fields accept, in a module that does not import keras-hub: checking the
config of any run (a CLC one too) reads them, and keras-hub's import costs about half a second."""

POOLING = ("cls", "mean")  # the intent head reads the [CLS] piece or the mean of the word pieces
