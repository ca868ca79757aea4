# slime's multi-turn custom generate function as its documentation shows it, unchanged but for
# the import line.
# Run: python train.py --custom-generate-function-path examples/custom_generate.py \
#          --max-turns 5 --env calc
from agentrl.rollout.custom import compute_reward, execute_tool, extract_tool_call, generate_single


# custom_generate.py
async def custom_generate(args, samples, evaluation=False):
    """Multi-turn generation with tool calling."""
    for sample in samples:
        conversation = sample.prompt

        for turn in range(args.max_turns):
            # Generate response
            response = await generate_single(conversation)

            # Check for tool call
            tool_call = extract_tool_call(response)
            if tool_call:
                tool_result = execute_tool(tool_call)
                conversation.append({"role": "assistant", "content": response})
                conversation.append({"role": "tool", "content": tool_result})
            else:
                break

        sample.response = response
        sample.reward = compute_reward(sample)

    return samples
