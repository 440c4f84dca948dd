// Internal AST of the Jinja subset, shared by the parser and the renderer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tokenizer::jinja {

enum class NodeKind {
  // statements
  kBlock,   // children: statements in order
  kText,    // text
  kOutput,  // children[0]: expression
  kIf,      // children: cond0, body0, cond1, body1, ..., [else body] (has_else)
  kFor,     // names: loop vars; children: iterable, body, [filter cond or null], [else body]
  kSet,     // names: target (1 name, or 2 for ns.attr); children[0]: value
  // expressions
  kLiteral,  // value
  kName,     // text
  kGetAttr,  // children[0]: object; text: attribute
  kGetItem,  // children[0]: object, children[1]: index
  kSlice,    // children: object, start|null, stop|null, step|null
  kCall,     // children[0]: callee, then positional args; kwarg_names for the trailing kwargs
  kFilter,   // text: name; children[0]: operand, then args; kwarg_names
  kTest,     // text: name; negated; children[0]: operand, then args
  kUnary,    // text: op ("not", "-", "+"); children[0]
  kBinary,   // text: op; children[0], children[1]
  kTernary,  // children: value_if_true, condition, value_if_false|null
  kList,     // children: items
  kDict,     // children: key0, value0, key1, value1, ...
};

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  nlohmann::json value;
  std::vector<std::string> names;
  std::vector<std::string> kwarg_names;  // names of the last kwarg_names.size() children
  std::vector<std::unique_ptr<Node>> children;
  bool negated = false;
  bool has_else = false;

  Node(NodeKind k, int l) : kind(k), line(l) {}
};

}  // namespace tokenizer::jinja
