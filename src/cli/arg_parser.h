// ArgParser: argparse-style command-line parsing for chunkpipe's subcommands: `--flag value`,
// `--flag=value`, boolean `--flag` / `--no-flag`, `_` and `-` equivalent, unique-prefix
// abbreviations, positionals in order. Errors name the offending flag. Single-threaded.
#pragma once

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace cli {

// The whole of `text` as a number, else argparse's "invalid int/float value" error naming
// --flag (for values a flag carries inside a list, such as --goodput ttft:MS).
common::Result<int64_t> parse_int_value(const std::string& flag, const std::string& text);
common::Result<double> parse_float_value(const std::string& flag, const std::string& text);

class ArgParser {
 public:
  ArgParser(std::string program, std::string description)
      : program_(std::move(program)), description_(std::move(description)) {}

  void add_positional(const std::string& name, const std::string& help);
  void add_option(const std::string& name, const std::string& help,
                  std::optional<std::string> default_value = std::nullopt);
  // An option taking one or more values (argparse nargs='+'); values are joined with '\n'.
  void add_multi_option(const std::string& name, const std::string& help);
  // A short spelling such as "-tp" for "tensor-parallel-size" ("-O3" works as "-O 3").
  void add_alias(const std::string& alias, const std::string& name);
  void add_flag(const std::string& name, const std::string& help);  // boolean, default false

  // Parses argv[first..]; on error the Status names the flag. `--help` sets help_requested().
  common::Status parse(int argc, char** argv, int first);

  bool help_requested() const { return help_requested_; }
  std::string usage() const;

  std::string positional(const std::string& name) const;
  std::optional<std::string> option(const std::string& name) const;
  bool flag(const std::string& name) const;
  // The option's value as an integer in [min_value, max_value]; errors in argparse's wording.
  // The option must have a value (a default or one given).
  common::Result<int64_t> int_option(const std::string& name, int64_t min_value,
                                     int64_t max_value = std::numeric_limits<int64_t>::max()) const;
  // The option's value, one of `choices` (argparse's "invalid choice" error otherwise, listing
  // them as given). The option must have a value (a default or one given).
  common::Result<std::string> choice_option(const std::string& name,
                                            const std::vector<std::string>& choices) const;
  // The option's value as a number >= min_value, in argparse's wording for float options.
  common::Result<double> double_option(
      const std::string& name, double min_value = -std::numeric_limits<double>::infinity()) const;

  // A subcommand's error exit: "PROGRAM: error: MESSAGE" on stderr, after the usage for usage
  // errors (code 2); returns `code`.
  int fail(const common::Status& status, int code) const;
  // Parses argv[first..] for a subcommand: the exit code when it should stop here (2 after a
  // usage error, 0 after printing --help), nothing when it should go on.
  std::optional<int> parse_or_exit(int argc, char** argv, int first);
  // Whether the option or flag was given on the command line (including --no-X).
  bool given(const std::string& name) const { return values_.count(name) != 0; }
  // Every option given, in canonical names, for the "non-default args" log line.
  const std::map<std::string, std::string>& given_values() const { return values_; }

 private:
  struct Spec {
    std::string name;  // canonical, with dashes, without leading "--"
    std::string help;
    bool is_flag = false;
    std::optional<std::string> default_value;
    bool multi = false;
  };
  common::Result<const Spec*> resolve(const std::string& given) const;

  std::string program_, description_;
  std::vector<std::pair<std::string, std::string>> positional_specs_;
  std::vector<Spec> specs_;
  std::map<std::string, std::string> aliases_;
  std::vector<std::string> positionals_;
  std::map<std::string, std::string> values_;
  bool help_requested_ = false;
};

}  // namespace cli
