"""Users recognition beside the pipeline (`docs/users-recognition.md`): a small index of ids
(memory or Redis) and the pass that sets user ids on earlier anonymous rows after a load."""
