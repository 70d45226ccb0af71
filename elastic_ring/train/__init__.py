"""The Horovod worker (one process per GPU or CPU slot) and the learning-rate rules."""
