package projection_test

import (
	"fmt"

	"github.com/projector-dev/projector/projection"
)

// A projection file declares which topic feeds which table and how each
// event type changes the row; Parse checks it and compiles the fold the
// engine runs.
func ExampleParse() {
	ps, err := projection.Parse([]byte(`projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: fold
    type_field: type
    columns:
      account_id: {type: text, primary_key: true}
      owner:      {type: text}
      balance:    {type: bigint, default: 0}
    events:
      AccountOpened: {set: {owner: owner}}
      Deposited:     {add: {balance: amount}}
      Withdrawn:     {add: {balance: "-amount"}}
      AccountClosed: {delete: true}
`), ".")
	if err != nil {
		fmt.Println(err)
		return
	}
	p := ps[0]
	fmt.Printf("%s: %s -> table %s, key column %s\n", p.Name, p.Topic, p.Table, p.KeyColumn)
	for _, c := range p.Columns {
		fmt.Printf("  %s %s\n", c.Name, c.Type)
	}

	// The engine folds each aggregate's events, in version order, into
	// its row; here by hand.
	var row projection.Row
	for _, ev := range []projection.Event{
		{Key: "acc-1", Version: 1, Type: "AccountOpened", Fields: map[string]any{"account_id": "acc-1", "owner": "Ada"}},
		{Key: "acc-1", Version: 2, Type: "Deposited", Fields: map[string]any{"account_id": "acc-1", "amount": int64(50)}},
		{Key: "acc-1", Version: 3, Type: "Withdrawn", Fields: map[string]any{"account_id": "acc-1", "amount": int64(20)}},
	} {
		if row, err = p.Apply(row, ev); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Printf("acc-1: owner %v, balance %v\n", row["owner"], row["balance"])

	// A mistake is reported with the projection and the field it is in.
	_, err = projection.Parse([]byte(`projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: fold
    type_field: type
    columns:
      account_id: {type: text}
      owner:      {type: text}
    events:
      AccountOpened: {set: {owner: owner}}
`), ".")
	fmt.Println(err)
	// Output:
	// accounts: accounts.events -> table accounts, key column account_id
	//   account_id text
	//   owner text
	//   balance bigint
	// acc-1: owner Ada, balance 30
	// projection "accounts": columns: exactly one column needs primary_key: true, found 0 ()
}
