"""What the apps share that belongs to none of them: the API's error answers."""
