"""Free cloud GPU sessions (seed 001: Kaggle and SageMaker) as files a person pushes.

The pieces both cloud backends share: the platforms' limits (`platforms`), the trainer
bundle and the session launcher that runs it there (`bundle`, `session`), and the run's
settings without the lab's hosts (`plan`). Nothing here talks to a cloud: the backends write
files and say which command hands them over.
"""
