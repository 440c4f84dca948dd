// --kv-transfer-config as the seeds write it, and the errors that name the field at fault.
#include "transfer/kv_transfer_config.h"

#include <gtest/gtest.h>

namespace {

// The seed's P node (2P1D), verbatim.
const char* kSeedProducer = R"({"kv_connector": "MooncakeConnectorV1",
       "kv_role": "kv_producer",
       "kv_port": "30000",
       "kv_connector_extra_config": {
               "prefill": {
                       "dp_size": 2,
                       "tp_size": 8
               },
               "decode": {
                       "dp_size": 32,
                       "tp_size": 1
               }
           }
       })";

std::string error_of(const std::string& text) {
  auto c = transfer::parse_kv_transfer_config(text);
  EXPECT_FALSE(c.ok()) << text;
  return c.ok() ? "" : c.status().message();
}

TEST(KvTransferConfigTest, SeedConfigParses) {
  auto c = transfer::parse_kv_transfer_config(kSeedProducer);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->kv_connector, "MooncakeConnectorV1");
  EXPECT_TRUE(c->is_producer());
  EXPECT_FALSE(c->is_consumer());
  EXPECT_EQ(c->kv_port, "30000");
  EXPECT_EQ(c->prefill->dp_size, 2);
  EXPECT_EQ(c->prefill->tp_size, 8);
  EXPECT_EQ(c->prefill->pp_size, 1);
  EXPECT_EQ(c->decode->dp_size, 32);
  EXPECT_EQ(c->engine_id.size(), 32u);  // made up when absent
  EXPECT_EQ(c->kv_load_failure_policy, "fail");
  auto pp = transfer::parse_kv_transfer_config(
      R"({"kv_connector":"MooncakeConnectorV1","kv_role":"kv_consumer","kv_port":36000,)"
      R"("engine_id":"2","kv_connector_extra_config":{"prefill":{"pp_size":2,"dp_size":1,)"
      R"("tp_size":8,"pp_layer_partition":"31,30"},"decode":{"dp_size":32,"tp_size":1}}})");
  ASSERT_TRUE(pp.ok()) << pp.status().message();
  EXPECT_EQ(pp->kv_port, "36000");  // an integer port reads as the string upstream uses
  EXPECT_EQ(pp->engine_id, "2");
  EXPECT_EQ(pp->prefill->pp_layer_partition, (std::vector<int>{31, 30}));
}

TEST(KvTransferConfigTest, ErrorsNameTheField) {
  const std::string m = R"("kv_connector":"MooncakeConnectorV1","kv_role":"kv_producer")";
  EXPECT_NE(error_of("{" + m + "}").find("needs 'kv_connector_extra_config.prefill'"),
            std::string::npos);
  EXPECT_NE(
      error_of(
          "{" + m +
          R"(,"kv_connector_extra_config":{"prefill":{"dp_size":1},"decode":{"dp_size":1,"tp_size":1}}})")
          .find("'kv_connector_extra_config.prefill.tp_size' is required"),
      std::string::npos);
  EXPECT_NE(
      error_of(
          "{" + m +
          R"(,"kv_connector_extra_config":{"prefill":{"dp_size":1,"tp_size":1},"decode":{"dp_size":1,"tp_size":2}}})")
          .find("must not be smaller than decode's (2)"),
      std::string::npos);
  EXPECT_NE(
      error_of(
          "{" + m +
          R"(,"kv_connector_extra_config":{"prefill":{"dp_size":1,"tp_size":1},"decode":{"dp_size":1,"tp_size":1,"pp_size":2}}})")
          .find("'kv_connector_extra_config.decode.pp_size' must be 1"),
      std::string::npos);
  EXPECT_NE(
      error_of(
          "{" + m +
          R"(,"kv_connector_extra_config":{"prefill":{"dp_size":1,"tp_size":1,"pp_size":2,"pp_layer_partition":"31"},"decode":{"dp_size":1,"tp_size":1}}})")
          .find("has 1 entries for pp_size 2"),
      std::string::npos);
  EXPECT_NE(
      error_of(
          "{" + m +
          R"(,"kv_connector_extra_config":{"prefill":{"dp_size":0,"tp_size":1},"decode":{"dp_size":1,"tp_size":1}}})")
          .find("prefill.dp_size' must be a positive integer"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"X","kv_role":"kv_both","kv_load_failure_policy":"retry"})")
                .find("'kv_load_failure_policy'"),
            std::string::npos);
  EXPECT_NE(
      error_of(R"({"kv_connector":"X","kv_role":"kv_both","kv_port":70000})").find("'kv_port'"),
      std::string::npos);
}

}  // namespace
