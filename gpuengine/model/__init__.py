"""The model: a network as a DAG of layers (`network`), the fusion passes over it (`passes`), and the static
training and inference programs wired from it for one batch size (`program`)."""
