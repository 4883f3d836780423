# cython: language_level=3
def ready():
    return True
