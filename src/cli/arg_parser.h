// ArgParser: argparse-style command-line parsing for chunkpipe's subcommands: `--flag value`,
// `--flag=value`, boolean `--flag` / `--no-flag`, `_` and `-` equivalent, unique-prefix
// abbreviations, positionals in order. Errors name the offending flag. Single-threaded.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace cli {

class ArgParser {
 public:
  ArgParser(std::string program, std::string description)
      : program_(std::move(program)), description_(std::move(description)) {}

  void add_positional(const std::string& name, const std::string& help);
  void add_option(const std::string& name, const std::string& help,
                  std::optional<std::string> default_value = std::nullopt);
  void add_flag(const std::string& name, const std::string& help);  // boolean, default false

  // Parses argv[first..]; on error the Status names the flag. `--help` sets help_requested().
  common::Status parse(int argc, char** argv, int first);

  bool help_requested() const { return help_requested_; }
  std::string usage() const;

  std::string positional(const std::string& name) const;
  std::optional<std::string> option(const std::string& name) const;
  bool flag(const std::string& name) const;

 private:
  struct Spec {
    std::string name;  // canonical, with dashes, without leading "--"
    std::string help;
    bool is_flag = false;
    std::optional<std::string> default_value;
  };
  common::Result<const Spec*> resolve(const std::string& given) const;

  std::string program_, description_;
  std::vector<std::pair<std::string, std::string>> positional_specs_;
  std::vector<Spec> specs_;
  std::vector<std::string> positionals_;
  std::map<std::string, std::string> values_;
  bool help_requested_ = false;
};

}  // namespace cli
