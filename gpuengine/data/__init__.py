"""Training data on the device: the resident data set and its shuffled gather, the host-streamed loader, the checks
every input passes, label encodings and the synthetic Rosenbrock set; `formats/` reads real data sets' files."""
