"""The outer recursion: a finished campaign's train episodes as training data (`export`), the offline learner that
"fine-tunes" the simulated agent on them (`learn`), and the model identity a training step names (`model`)."""
