"""slime's custom reward model class, made runnable: a tiny "model" that scores a response
by whether it states the expected answer to the arithmetic question in the prompt.

Run: python train.py --env calc --custom-rm-path examples/custom_rm.py --rm-model-path exact
"""

import re

from agentrl_tools.calculator import safe_eval

_QUESTION = re.compile(r"What is (.+?)\?")
_ANSWER = re.compile(r"Answer:\s*(-?\d+)")


def load_model(model_path):
    """Stands in for loading weights: ``exact`` scores 1/0, ``partial`` gives 0.5 for any
    answer in the right format."""
    if model_path not in ("exact", "partial"):
        raise ValueError(f"unknown reward model {model_path!r}: use 'exact' or 'partial'")
    return model_path


class CustomRewardModel:
    def __init__(self, model_path):
        self.model = load_model(model_path)

    def tokenize(self, prompts, responses):
        pairs = []
        for prompt, response in zip(prompts, responses, strict=True):
            text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt)
            question = _QUESTION.search(text)
            answer = _ANSWER.findall(response)
            pairs.append((question.group(1) if question else None, answer[-1] if answer else None))
        return pairs

    def score(self, inputs):
        scores = []
        for expression, answer in inputs:
            if answer is None or expression is None:
                scores.append(0.0)
            elif self.model == "partial":
                scores.append(0.5)
            else:
                expected = safe_eval(expression)
                scores.append(1.0 if int(answer) == expected else 0.0)
        return scores

    def compute_reward(self, prompts, responses):
        inputs = self.tokenize(prompts, responses)
        scores = self.score(inputs)
        return scores
