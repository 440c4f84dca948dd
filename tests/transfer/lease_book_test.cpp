// LeaseBook: a lease ends once; a resent DONE is acknowledged, any other late DONE is not.
#include "transfer/lease_book.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using Ids = std::vector<std::string>;

TEST(LeaseBookTest, DoneEndsALeaseOnceAndItsOwnResendIsAcknowledged) {
  transfer::LeaseBook book(480);
  book.add({"a", "b"}, 0);
  EXPECT_EQ(book.active(), 2u);
  EXPECT_TRUE(book.done("a", 7, 1));
  EXPECT_EQ(book.take_ended(), Ids{"a"});
  // The reader timed out waiting for the ACK and sent the same DONE again.
  EXPECT_TRUE(book.done("a", 7, 2));
  EXPECT_TRUE(book.take_ended().empty()) << "the blocks are freed once";
  // Another reader of the same blocks (a proxy retry) read after they were handed back.
  EXPECT_FALSE(book.done("a", 8, 3));
  EXPECT_EQ(book.active(), 1u);
}

TEST(LeaseBookTest, ExpiryEndsALeaseAndSpoilsEveryLaterDone) {
  transfer::LeaseBook book(10);
  book.add({"a"}, 0);
  EXPECT_TRUE(book.expire(9.9).empty());
  EXPECT_EQ(book.expire(10), Ids{"a"});
  EXPECT_EQ(book.take_ended(), Ids{"a"});
  EXPECT_FALSE(book.done("a", 1, 11));
  EXPECT_TRUE(book.take_ended().empty());
}

TEST(LeaseBookTest, ADoneBeforeItsLeaseEndsTheLeaseWhenItArrives) {
  transfer::LeaseBook book(10);
  EXPECT_TRUE(book.done("a", 5, 0));
  EXPECT_TRUE(book.done("a", 5, 0.5)) << "its resend";
  EXPECT_TRUE(book.take_ended().empty());
  book.add({"a"}, 1);
  EXPECT_EQ(book.active(), 0u);
  EXPECT_EQ(book.take_ended(), Ids{"a"});
  EXPECT_TRUE(book.done("a", 5, 2));
  EXPECT_FALSE(book.done("a", 6, 2));
}

TEST(LeaseBookTest, EndedLeasesAreForgottenAfterAnotherLeasePeriod) {
  transfer::LeaseBook book(10);
  book.add({"a"}, 0);
  EXPECT_TRUE(book.done("a", 1, 1));
  book.take_ended();
  book.expire(12);
  // Forgotten: a DONE this late is a stray early DONE, acknowledged and kept for a period.
  EXPECT_TRUE(book.done("a", 2, 12));
  book.expire(30);
  book.add({"a"}, 30);
  EXPECT_EQ(book.active(), 1u) << "the stray DONE was forgotten too";
}

}  // namespace
