"""Adapters that put the guard in front of real agent frameworks' summarize calls.

Each adapter lives in its own module and imports its framework only there, so `import policyhook`
never needs LangChain or langmem:

- `policyhook.adapters.langchain`: `GuardedSummarizationMiddleware`, a drop-in subclass of
  LangChain v1's `SummarizationMiddleware`.
- `policyhook.adapters.langmem`: `summarize_messages` / `asummarize_messages`, guarded versions of
  langmem's running-summary functions.
- `policyhook.adapters.claude_code`: the `policyhook claude-precompact` command, a Claude Code
  `PreCompact` hook.

All of them decide through `Guard`, so every decision gets the same span, metrics, decision log and
listeners as a decorated summarizer.
"""
