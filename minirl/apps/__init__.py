"""The applications built on the chapter's modules: the command line (cli.py, train_commands.py, model_commands.py), `minirl eval`
(evaluation.py, eval_summary.py, eval_folder.py, eval_command.py), the quickstart and the recipes
on real checkpoints, and the rollout and eval viewers. Nothing else in minirl/ imports them but
`__main__.py` (the CLI) and the harness's evaluation during training (run/grpo.py, run/sft_eval.py call
evaluation.evaluate)."""
