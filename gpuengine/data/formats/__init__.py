"""Readers of real data sets' files: MNIST IDX, BMP folders, the CIFAR binary batches, a tab-separated corpus."""
