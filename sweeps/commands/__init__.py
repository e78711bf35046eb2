"""The library's command lines: each module is `python -m sweeps.commands.NAME` (`ready COMMAND`), a
`main(argv)` that parses its options and calls functions of `ready/`, which itself has no command line.

    python -m sweeps.commands.generate ...      # ready generate: decode prompts with the target, AR or a drafter
    python -m sweeps.commands.export SRC OUT    # ready export: a drafter as a DSpark folder
    python -m sweeps.commands.build_data        # ready build-data: the embedded default target, built or found
    python -m sweeps.commands.train_launch ...  # ready launch: one row's training, under torchrun or not
"""
