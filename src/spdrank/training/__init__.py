"""Training the student: the settings (one field per ``spdrank train`` flag), the target
matrices, the slates read as needed, the frozen backbone's cached states, a warm start from a
checkpoint, the data-parallel launcher and the accelerate loop.
"""
