"""The ChatML chat template asyncrl writes into the tokenizers it builds from Qwen's vocabularies.

Qwen's own templates rewrite earlier turns once a turn is added (Qwen3's drops an earlier turn's
reasoning, and gives the last assistant turn an empty `<think>` block), so a conversation
cannot be continued by appending tokens. This one renders every message by itself, the same
wherever it stands, so each turn of an episode is the exact continuation of the ones before:

- `system`: its own turn (first), with the `tools` passed to the template listed after its text;
- `user`: its own turn;
- `assistant`: an optional reasoning block (`reasoning_content`, as `<think>…</think>`), the
  content as written (a `<think>` block the model wrote stays where it is), then each of
  `tool_calls` (OpenAI format) as a `<tool_call>` block with the call's JSON;
- `tool`: a user turn holding `<tool_response>…</tool_response>`, one turn per result (Qwen
  groups consecutive results into one turn, which makes a result's rendering depend on the next).

`add_generation_prompt` opens an assistant turn; with `enable_thinking: false` it also writes an
empty reasoning block, as Qwen3's template does. Content given as a list of parts keeps its text
parts.
"""

from __future__ import annotations

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions. Their signatures are listed in "
    "<tools></tools>:\n<tools>"
)
TOOLS_USAGE = (
    "\n</tools>\n\nTo call a function, write its name and arguments as JSON within "
    '<tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)

CHATML_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}"
    "{%- if part is mapping and part.get('type') == 'text' -%}{{- part.get('text', '') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    # the system turn: the first message's text if it is a system one, then the tools
    "{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- text(messages[0]['content']) + '\\n\\n' -}}{%- endif -%}"
    "{{- '" + TOOLS_PREAMBLE.replace("\n", "\\n") + "' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '" + TOOLS_USAGE.replace("\n", "\\n") + "<|im_end|>\\n' -}}"
    "{%- elif has_system -%}"
    "{{- '<|im_start|>system\\n' + text(messages[0]['content']) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = message['role'] -%}"
    "{%- if role == 'system' -%}"
    "{%- if not loop.first -%}"
    "{{- '<|im_start|>system\\n' + text(message['content']) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif role == 'user' -%}"
    "{{- '<|im_start|>user\\n' + text(message['content']) + '<|im_end|>\\n' -}}"
    "{%- elif role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message.get('reasoning_content') -%}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- set content = text(message.get('content')) -%}"
    "{{- content -}}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set function = call['function'] if call.get('function') is mapping else call -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (function['name'] | tojson) + ', \"arguments\": ' -}}"
    "{%- if function.get('arguments') is string -%}{{- function['arguments'] -}}"
    "{%- else -%}{{- (function.get('arguments') or {}) | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + text(message['content']) -}}"
    "{{- '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- raise_exception('unknown role: ' + role) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)
